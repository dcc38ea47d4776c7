"""The response store's bounds (entries, bytes, age: the oldest goes first), its isolation by
bearer key, and its metrics."""

from __future__ import annotations

import json

from prometheus_client import CollectorRegistry

from argosy.server.responses.store import ResponseStore, owner_of

ALICE, BOB = owner_of("Bearer alice"), owner_of("Bearer bob")


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def store(entries: int = 10, max_bytes: int = 1 << 20, ttl: float = 60.0, clock=None) -> ResponseStore:
    return ResponseStore(entries, max_bytes, ttl, CollectorRegistry(), "m", clock or Clock())


def response(i: int, padding: int = 0) -> dict:
    return {"id": f"resp_{i}", "output": "x" * padding}


def test_the_oldest_entries_go_first_past_the_entry_bound():
    s = store(entries=3)
    for i in range(5):
        s.put(ALICE, response(i), [])
    assert [s.get(ALICE, f"resp_{i}") is not None for i in range(5)] == [False, False, True, True, True]
    assert len(s.entries) == 3


def test_the_byte_bound_counts_the_response_and_its_conversation():
    one = len(json.dumps(response(0, 100))) + len(json.dumps([{"role": "user", "content": "hi"}]))
    s = store(max_bytes=2 * one)
    for i in range(3):
        s.put(ALICE, response(i, 100), [{"role": "user", "content": "hi"}])
    assert s.bytes == 2 * one and s.get(ALICE, "resp_0") is None and s.get(ALICE, "resp_2") is not None
    s.put(ALICE, response(9, 10 * one), [])  # larger than the whole store: not kept, nothing evicted
    assert s.get(ALICE, "resp_9") is None and s.get(ALICE, "resp_1") is not None


def test_entries_expire_after_their_time():
    clock = Clock()
    s = store(ttl=10.0, clock=clock)
    s.put(ALICE, response(0), [])
    clock.now = 5.0
    s.put(ALICE, response(1), [])
    clock.now = 12.0
    assert s.get(ALICE, "resp_0") is None and s.get(ALICE, "resp_1") is not None
    clock.now = 16.0
    assert s.get(ALICE, "resp_1") is None and s.bytes == 0


def test_one_key_never_reads_or_deletes_anothers():
    s = store()
    s.put(ALICE, response(0), [{"role": "user", "content": "secret"}])
    assert s.get(BOB, "resp_0") is None and not s.delete(BOB, "resp_0")
    assert s.get(ALICE, "resp_0").conversation == [{"role": "user", "content": "secret"}]
    assert s.delete(ALICE, "resp_0") and s.get(ALICE, "resp_0") is None and s.bytes == 0
    assert owner_of(None) == owner_of("") != ALICE


def test_a_store_of_no_entries_is_off():
    s = store(entries=0)
    s.put(ALICE, response(0), [])
    assert not s.enabled and s.get(ALICE, "resp_0") is None


def test_the_metrics_count_entries_bytes_and_lookups():
    registry = CollectorRegistry()
    s = ResponseStore(10, 1 << 20, 60.0, registry, "m", Clock())
    s.put(ALICE, response(0), [])
    s.get(ALICE, "resp_0"), s.get(BOB, "resp_0"), s.get(ALICE, "resp_1")
    labels = {"model_name": "m"}
    assert registry.get_sample_value("argosy_responses_stored", labels) == 1
    assert registry.get_sample_value("argosy_responses_stored_bytes", labels) == s.bytes > 0
    assert registry.get_sample_value("argosy_responses_store_lookups_total", labels | {"result": "hit"}) == 1
    assert registry.get_sample_value("argosy_responses_store_lookups_total", labels | {"result": "miss"}) == 2
