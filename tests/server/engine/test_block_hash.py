"""Block hashes: the default chain is the documented one (computed here from its description), and
sha256_cbor is vLLM's, checked against cbor2 (the encoder vLLM uses) over vLLM's published scheme:
the first parent sha256(cbor(PYTHONHASHSEED)), each block sha256(cbor((parent, tuple(tokens), extra)))."""

from __future__ import annotations

import hashlib

import cbor2
import pytest

from argosy import SamplingParams
from argosy.server.engine.block_hash import BlockHasher, cbor
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from tests.checkpoints import tiny_llm
from tests.server.kv_events.vllm_subscriber import Subscriber, chain

VALUES = [None, 0, 23, 24, 255, 256, 65535, 65536, 2**32, 2**64 - 1, -1, -24, -25, -(2**40), b"", b"\x00" * 40,
          "", "42", "é" * 30, [], [1, [2, b"x"], None], tuple(range(300)), (b"\xff" * 32, (5, 6), None)]  # fmt: skip


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_cbor_is_cbor2s_canonical_encoding(value):
    assert cbor(value) == cbor2.dumps(value, canonical=True)


def vllm_chain(tokens: list[int], block_size: int, seed: str, extra=None) -> list[int]:
    parent, out = hashlib.sha256(cbor2.dumps(seed, canonical=True)).digest(), []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tuple(tokens[start : start + block_size])
        parent = hashlib.sha256(cbor2.dumps((parent, block, extra), canonical=True)).digest()
        out.append(int.from_bytes(parent[-8:], "big"))
    return out


def external(hasher: BlockHasher, tokens: list[int], adapter: bytes | None = None) -> list[int]:
    parent, out = None, []
    for start in range(0, len(tokens) - 15, 16):
        parent = hasher(parent, tokens[start : start + 16], adapter)
        out.append(int.from_bytes(parent[-8:], "big"))
    return out


def test_both_algorithms_are_their_published_schemes():
    tokens = [(31 * i) % 50000 for i in range(70)]
    assert external(BlockHasher(), tokens) == chain(tokens, 16)
    assert external(BlockHasher("sha256_cbor", "42"), tokens) == vllm_chain(tokens, 16, "42")
    digest = bytes(range(32))
    assert external(BlockHasher("sha256_cbor", "42"), tokens, digest) == vllm_chain(tokens, 16, "42", (digest.hex(),))
    assert external(BlockHasher("sha256_cbor", "7"), tokens) != vllm_chain(tokens, 16, "42")
    # Unseeded, as vLLM: each process its own chain.
    assert external(BlockHasher("sha256_cbor"), tokens) != external(BlockHasher("sha256_cbor"), tokens)


def test_the_engine_announces_vllm_hashes_with_sha256_cbor(llama_checkpoint, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "1234")
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*"}
    llm = tiny_llm(llama_checkpoint, kv_events_config=config, prefix_caching_hash_algo="sha256_cbor")
    sub = Subscriber(llm.engine.core.kv_events.bound_endpoints[0])
    try:
        probe = SamplingParams(temperature=0.0, max_tokens=1)
        sub.wait_connected(lambda: (llm.generate({"prompt_token_ids": [9] * 17}, probe), llm.reset_prefix_cache()))
        sub.messages.clear()
        prompt = [(7 * i) % 290 + 3 for i in range(40)]
        llm.generate({"prompt_token_ids": prompt}, probe)
        sub.drain(llm.engine.core.kv_events)
        stored = [h for e in sub.events() if e["type"] == "BlockStored" for h in e["block_hashes"]]
        assert stored == vllm_chain(prompt, 16, "1234")
    finally:
        sub.close()
    with pytest.raises(InvalidRequestError, match="prefix_caching_hash_algo"):
        EngineConfig(prefix_caching_hash_algo="xxhash")
