"""The host tier's bookkeeping and its scheduling, without a model: least recently used out, a
slot being loaded never overwritten in the same step, the pool within its size, a returning
sequence's blocks loaded (not computed) while it waits a step, and a preempted one recomputing at
most its last, partial block."""

from __future__ import annotations

import pytest
import torch

from argosy.server.kv_tier.host_cache import HostKVCache
from argosy.server.kv_tier.host_pool import HostBlockPool
from tests.server.scheduling.simulation import BLOCK, Simulation


def h(i: int) -> bytes:
    return i.to_bytes(4, "little")


def test_stores_fill_free_slots_then_replace_the_least_recently_used():
    pool = HostBlockPool(2)
    pool.store(10, h(1))
    pool.store(11, h(2))
    pool.store(12, h(1))  # held already: used now, no copy
    pool.store(13, h(3))  # replaces h(2), the least recently used
    stores, loads = pool.take_copies()
    assert [block for block, _ in stores] == [10, 11, 13] and loads == []
    assert h(1) in pool and h(3) in pool and h(2) not in pool
    assert stores[2][1] == stores[1][1]  # h(3) took h(2)'s slot
    assert len(pool) == 2 and pool.stats().blocks_stored == 3


def test_a_slot_loaded_this_step_is_not_overwritten_by_a_store_of_the_same_step():
    pool = HostBlockPool(1)
    pool.store(10, h(1))
    pool.take_copies()
    pool.lock([h(1)])
    pool.store(20, h(2))  # the only slot is being loaded: the evicted block is dropped
    pool.load(h(1), 5)
    stores, loads = pool.take_copies()
    assert stores == [] and loads == [(0, 5)] and h(1) in pool and h(2) not in pool
    pool.store(20, h(2))  # unlocked once the step's copies are taken
    assert h(2) in pool and h(1) not in pool


def test_hits_count_from_the_first_hash_on_and_clear_forgets_everything():
    pool = HostBlockPool(4)
    for i in (1, 2, 4):
        pool.store(i, h(i))
    assert pool.hits([h(1), h(2), h(3), h(4)]) == 2
    pool.clear()
    assert len(pool) == 0 and pool.hits([h(1)]) == 0


def test_copies_store_before_they_load_and_round_trip_blocks():
    cache = HostKVCache(3, (2, 2, BLOCK, 1, 2), torch.float32, torch.device("cpu"))
    kv = torch.randn(2, 2, 5, BLOCK, 1, 2)
    original = kv.clone()
    # Block 1 goes to slot 0 while slot 2's contents (block 3's, stored earlier) come into it.
    cache.copy(kv, [(3, 2)], [])
    cache.copy(kv, [(1, 0)], [(2, 1)])
    assert torch.equal(kv[:, :, 1], original[:, :, 3])
    cache.copy(kv, [], [(0, 4)])
    assert torch.equal(kv[:, :, 4], original[:, :, 1])
    assert torch.equal(kv[:, :, [0, 2, 3]], original[:, :, [0, 2, 3]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side stream and pinned slots need CUDA")
def test_on_cuda_a_store_reads_blocks_before_the_step_overwrites_them_and_loads_land_before_the_next():
    device = torch.device("cuda")
    cache = HostKVCache(8, (4, 2, BLOCK, 2, 64), torch.float16, device)
    kv = torch.randn(4, 2, 16, BLOCK, 2, 64, device=device, dtype=torch.float16)
    original = kv.clone()
    cache.copy(kv, [(b, b) for b in range(8)], [])
    kv.zero_()  # the step's writes, queued on the current stream right after the copies
    cache.copy(kv, [], [(b, 8 + b) for b in range(8)])
    cache.copy(kv, [], [])  # the next step starts by waiting for them
    kv[:, :, 8:].mul_(2)  # and then reads what was loaded
    torch.cuda.synchronize()
    assert torch.equal(kv[:, :, 8:], 2 * original[:, :, :8]) and not kv[:, :, :8].any()


def distinct_prompt(start: int, length: int) -> list[int]:
    return list(range(start, start + length))


def test_a_returning_prompt_loads_its_evicted_blocks_and_computes_from_the_next_step():
    sim = Simulation("fcfs", num_blocks=8, host_blocks=16, max_num_batched_tokens=64)
    first = distinct_prompt(1000, 6 * BLOCK + 2)
    sim.add("first", 0, 1, prompt=first)
    sim.run(2)
    # Takes the free block, then first's, tail first: all but its first block leave the device.
    sim.add("other", 0, 1, prompt=distinct_prompt(2000, 7 * BLOCK))
    sim.run(2)
    assert len(sim.kv.connector.pool) == 5 and sim.kv.connector.stats().blocks_stored == 5
    again = sim.add("again", 0, 1, prompt=first)
    ran = sim.step()
    assert again not in ran and again in sim.scheduler.running  # loading: a seat, no compute
    assert len(sim.last.kv_connector.loads) == 5 and sim.last.has_work
    assert again.num_computed_tokens == 6 * BLOCK
    ran = sim.step()
    assert ran == [again] and sim.last.scheduled[0].num_new_tokens == 2
    assert again.request.num_cached_tokens == 6 * BLOCK
    assert sim.kv.connector.stats().hit_tokens == 5 * BLOCK and sim.kv.prefix_cache_hits == BLOCK


def test_a_preempted_sequence_recomputes_at_most_its_last_partial_block():
    sim = Simulation("fcfs", num_blocks=12, max_num_seqs=4, host_blocks=64, max_num_batched_tokens=32)
    for i in range(4):
        sim.add(str(i), 0, 20, prompt=distinct_prompt(1000 * (i + 1), 2 * BLOCK + 1))
    while sim.scheduler.has_work():
        sim.step()
    assert sim.scheduler.num_preemptions > 0
    assert 0 < sim.scheduler.recomputed_tokens <= sim.scheduler.num_preemptions * BLOCK
    assert sim.kv.num_used_blocks == 0 and len(sim.kv.connector.pool) <= 64


def test_without_the_tier_a_preempted_sequence_recomputes_more():
    def recomputed(host_blocks: int) -> tuple[int, int]:
        sim = Simulation("fcfs", num_blocks=12, max_num_seqs=4, host_blocks=host_blocks, max_num_batched_tokens=32)
        for i in range(4):
            sim.add(str(i), 0, 20, prompt=distinct_prompt(1000 * (i + 1), 2 * BLOCK + 1))
        while sim.scheduler.has_work():
            sim.step()
        return sim.scheduler.recomputed_tokens, sim.scheduler.num_preemptions

    with_tier, without = recomputed(64), recomputed(0)
    assert with_tier[0] / with_tier[1] < without[0] / without[1]
