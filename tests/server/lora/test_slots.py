"""The device slots' decisions: a held slot is never given to another adapter; an idle one is
(an empty one first, else the least recently used); retired adapters leave once idle; and the
host cache keeps at most max_cpu_loras unheld adapters, least recently used out first."""

from __future__ import annotations

import pytest

from argosy.server.engine_config import EngineConfig, resolve_limits
from argosy.server.lora.adapter_folder import AdapterError, inspect_adapter
from argosy.server.lora.host_cache import AdapterHostCache
from argosy.server.lora.request import AdapterRef
from argosy.server.lora.slots import LoRASlots
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.worker import Worker
from tests.adapters import make_adapter

A, B, C = (AdapterRef(n, f"/adapters/{n}", n * 64) for n in "abc")


def test_a_held_slot_is_never_given_to_another_adapter():
    slots = LoRASlots(2)
    assert slots.acquire(A) == 0 and slots.acquire(B) == 1
    assert slots.take_loads() == [(0, A), (1, B)]
    assert slots.acquire(A) == 0 and slots.take_loads() == []  # already there: held twice, no load
    assert not slots.can_acquire(C)
    with pytest.raises(RuntimeError, match="no idle LoRA slot"):
        slots.acquire(C)
    slots.release(1)
    assert slots.can_acquire(C) and slots.acquire(C) == 1 and slots.take_loads() == [(1, C)]
    assert slots.holders == [2, 1]


def test_an_idle_slot_goes_empty_first_then_least_recently_used():
    slots = LoRASlots(3)
    for ref in (A, B):
        slots.release(slots.acquire(ref))
    assert slots.acquire(C) == 2  # the empty one, though A's and B's are idle
    slots.release(2)
    slots.release(slots.acquire(A))  # A is now used more recently than B
    new = AdapterRef("d", "/d", "d" * 64)
    assert slots.acquire(new) == 1 and slots.refs == [A, new, C]


def test_a_retired_adapter_leaves_its_slot_once_idle():
    slots = LoRASlots(2)
    slot = slots.acquire(A)
    slots.retire(A.digest)
    assert slots.refs[slot] == A  # a request still runs on it
    slots.release(slot)
    assert slots.refs[slot] is None
    with pytest.raises(RuntimeError, match="released more often"):
        slots.release(slot)


def test_the_host_cache_evicts_unheld_adapters_least_recently_used_first(llama_checkpoint, tmp_path):
    model = ModelConfig.from_folder(llama_checkpoint)
    refs = []
    for i in range(3):
        folder = make_adapter(llama_checkpoint, tmp_path / f"a{i}", seed=i)
        refs.append(AdapterRef(f"a{i}", str(folder), inspect_adapter(folder, model, 16).digest))
    config = EngineConfig(model=str(llama_checkpoint), enable_lora=True, dtype="float32")
    worker = Worker(config, model, resolve_limits(config, model), (2,))
    cache = AdapterHostCache(worker, max_cpu_loras=1)
    cache.hold(refs[0])
    cache.load(refs[1])
    assert set(cache.names().values()) == {"a0", "a1"}  # a0 is held: beyond the limit
    assert set(worker.adapters) == set(cache.names())
    cache.load(refs[2])
    assert set(cache.names().values()) == {"a0", "a2"}  # a1, unheld and older, went
    assert set(worker.adapters) == set(cache.names())
    cache.release(refs[0].digest)
    assert set(cache.names().values()) == {"a2"}
    assert set(worker.adapters) == set(cache.names())
    changed = AdapterRef("a0", refs[0].path, refs[1].digest)  # the name stood for other weights
    with pytest.raises(AdapterError, match="the weights changed since adapter 'a0' was loaded"):
        cache.hold(changed)
    assert cache.holders == {}
