"""Block pool and KV-cache manager invariants under random operation sequences: no block
owned twice, reference counts exact, only a sequence's last block partly empty, and every
block free once all sequences finish or are aborted."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.sampling_params import SamplingParams

BLOCK = 4
NUM_BLOCKS = 24
PREFIXES = [[1] * 9, [2, 3] * 5, []]


class KVCacheMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.kv = KVCacheManager(NUM_BLOCKS, BLOCK, enable_prefix_caching=True)
        self.live: list[Sequence] = []
        self.ids = itertools.count()

    @rule(
        prefix=st.sampled_from(PREFIXES),
        tail=st.lists(st.integers(0, 5), min_size=1, max_size=10),
        chunk=st.integers(1, 12),
    )
    def admit(self, prefix, tail, chunk):
        tokens = prefix + tail
        seq = Sequence(next(self.ids), Request("r", tokens, SamplingParams()), 0, tokens)
        cached = self.kv.cached_prefix(seq)
        assert len(cached) * BLOCK < len(tokens)  # at least one token is always computed
        num_new = min(chunk, len(tokens) - len(cached) * BLOCK)
        free_before = self.kv.pool.num_free
        if self.kv.allocate(seq, num_new, cached):
            seq.num_computed_tokens += num_new
            self.kv.cache_full_blocks(seq)
            self.live.append(seq)
        else:
            assert self.kv.pool.num_free == free_before and seq.block_table == []

    @precondition(lambda self: self.live)
    @rule(data=st.data(), chunk=st.integers(1, 6))
    def step(self, data, chunk):
        """Computes the next chunk of a sequence, or decodes one new token once its prompt is done."""
        seq = data.draw(st.sampled_from(self.live))
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(data.draw(st.integers(0, 5)))
        num_new = min(chunk, seq.num_tokens - seq.num_computed_tokens)
        table_before = list(seq.block_table)
        if self.kv.allocate(seq, num_new):
            seq.num_computed_tokens += num_new
            self.kv.cache_full_blocks(seq)
            assert self.kv.pool.ref_count(seq.block_table[-1]) == 1  # written blocks are never shared
        else:
            assert seq.block_table == table_before

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def fork(self, data):
        parent = data.draw(st.sampled_from(self.live))
        child = parent.fork(next(self.ids), 1)
        self.kv.fork(parent, child)
        self.live.append(child)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish_or_abort(self, data):
        seq = data.draw(st.sampled_from(self.live))
        self.live.remove(seq)
        self.kv.free(seq)
        assert seq.block_table == []

    @invariant()
    def reference_counts_are_exact(self):
        owners = Counter(b for seq in self.live for b in seq.block_table)
        for block in self.kv.pool.blocks:
            assert block.ref_count == owners[block.block_id]
        assert self.kv.pool.num_free == sum(1 for b in self.kv.pool.blocks if b.ref_count == 0)

    @invariant()
    def no_sequence_holds_a_block_twice_and_only_the_last_is_partial(self):
        for seq in self.live:
            assert len(set(seq.block_table)) == len(seq.block_table)
            assert len(seq.block_table) == -(-seq.num_computed_tokens // BLOCK)

    @invariant()
    def cached_blocks_hold_their_hash(self):
        for block_hash, block_id in self.kv.pool._cached.items():
            assert self.kv.pool.blocks[block_id].block_hash == block_hash

    def teardown(self):
        for seq in self.live:
            self.kv.free(seq)
        assert self.kv.pool.num_free == NUM_BLOCKS
        assert all(b.ref_count == 0 for b in self.kv.pool.blocks)


KVCacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestKVCacheManager = KVCacheMachine.TestCase


def _computed_sequence(kv: KVCacheManager, seq_id: int, tokens: list[int]) -> Sequence:
    seq = Sequence(seq_id, Request(str(seq_id), tokens, SamplingParams()), 0, tokens)
    hits = kv.cached_prefix(seq)
    assert kv.allocate(seq, len(tokens) - len(hits) * BLOCK, hits)
    seq.num_computed_tokens = len(tokens)
    kv.cache_full_blocks(seq)
    return seq


def test_freed_prefix_blocks_stay_reusable_until_evicted():
    kv = KVCacheManager(5, BLOCK, enable_prefix_caching=True)
    first = _computed_sequence(kv, 0, list(range(9)))  # blocks: full, full, partial
    full_blocks = first.block_table[:2]
    kv.free(first)
    assert kv.pool.num_free == 5
    other = _computed_sequence(kv, 1, [100] * 8)  # takes the two never-used blocks
    assert not set(other.block_table) & set(full_blocks)
    again = _computed_sequence(kv, 2, list(range(9)))
    assert again.block_table[:2] == full_blocks


def test_eviction_takes_a_prefix_tail_before_its_head():
    kv = KVCacheManager(5, BLOCK, enable_prefix_caching=True)
    first = _computed_sequence(kv, 0, list(range(9)))
    head_id = first.block_table[0]
    head, tail = (kv.pool.blocks[b].block_hash for b in first.block_table[:2])
    kv.free(first)
    _computed_sequence(kv, 1, [100] * 16)  # four blocks: two unused, the partial one, then the tail
    assert kv.pool.lookup(head) == head_id
    assert kv.pool.lookup(tail) is None


def test_shared_partial_block_is_copied_before_it_is_written():
    kv = KVCacheManager(8, BLOCK, enable_prefix_caching=False)
    tokens = list(range(6))
    parent = Sequence(0, Request("a", tokens, SamplingParams(n=2)), 0, tokens)
    assert kv.allocate(parent, 6)
    parent.num_computed_tokens = 6
    child = parent.fork(1, 1)
    kv.fork(parent, child)
    shared = parent.block_table[-1]
    assert kv.pool.ref_count(shared) == 2
    child.token_ids.append(7)
    assert kv.allocate(child, 1)
    assert child.block_table[-1] != shared and kv.pool.ref_count(shared) == 1
    assert kv.take_pending_copies() == [(shared, child.block_table[-1])] and kv.take_pending_copies() == []
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
