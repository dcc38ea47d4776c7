"""KVCacheManager: gives each sequence the blocks its tokens need, through the BlockPool.

It finds a new sequence's longest cached prefix (on the device, then, with a KV connector, the
blocks after it that the connector can supply, which it loads into new blocks), takes blocks on
demand as tokens arrive,
copies a shared block before a sequence writes into it (copy-on-write), registers blocks
in the prefix cache as they fill (only with tokens kept: never one a step computed and then
dropped), gives back the blocks past a length, and returns every block when a sequence leaves.
Every change to a block table is marked on the sequence, for the next step plan."""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.server.engine.block_hash import BlockHasher
from argosy.server.engine.block_pool import BlockPool
from argosy.server.engine.sequence import Sequence
from argosy.server.kv_connector.base import ConnectorScheduler
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_events.recorder import KVEventRecorder
from argosy.server.kv_events.wire import KVCacheEvent

if TYPE_CHECKING:
    from argosy.server.kv_connector.metadata import KVConnectorMeta


class KVCacheManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        connector: ConnectorScheduler | None = None,
        events: KVEventRecorder | None = None,
        hasher: BlockHasher | None = None,
    ):
        self.block_size = block_size
        self.hasher = hasher or BlockHasher()
        self.connector = connector  # whose blocks are found by the prefix cache's hashes
        self.events = events  # told what enters and leaves the prefix cache, with KV events on
        told = events is not None or connector is not None
        self.pool = BlockPool(num_blocks, enable_prefix_caching, self._on_evict if told else None)
        self.enable_prefix_caching = enable_prefix_caching
        self._pending_copies: list[tuple[int, int]] = []  # (src, dst) block copies for the runner
        # By sequence: the sequence, the first block of its table being loaded, and the blocks;
        # they join the prefix cache once their loads are reported done.
        self._loading: dict[int, tuple[Sequence, int, list[int]]] = {}
        self.prefix_cache_queries = 0  # tokens looked up
        self.prefix_cache_hits = 0  # tokens found

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free

    def take_pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) block copies decided since the last call, for the model runner to
        make before the step's forward pass; handed over once."""
        copies, self._pending_copies = self._pending_copies, []
        return copies

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks already holding the sequence's leading full blocks. At least one token is
        always left to compute, since its logits are needed."""
        if not self.enable_prefix_caching:
            return []
        self._extend_hashes(seq, seq.num_tokens)
        hits = []
        for block_hash in seq.block_hashes[: (seq.num_tokens - 1) // self.block_size]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def external_prefix(self, seq: Sequence, num_cached_blocks: int) -> int:
        """How many blocks after the device's hits the connector can supply (with the same bound:
        at least one token is left to compute)."""
        if self.connector is None:
            return 0
        return self.connector.get_num_new_matched_tokens(seq, num_cached_blocks) // self.block_size

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_cached_blocks: int = 0, num_loaded: int = 0) -> int:
        hit = num_cached_blocks + num_loaded
        table_len = max(len(seq.block_table), hit)
        computed = max(seq.num_computed_tokens, hit * self.block_size)
        needed = -(-(computed + num_new_tokens) // self.block_size) - table_len + num_loaded
        return needed + int(self._shared_block(seq) is not None)

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached_blocks: list[int], num_loaded: int = 0) -> bool:
        """Whether `allocate` would find the blocks (it changes nothing)."""
        needed = self.blocks_needed(seq, num_new_tokens, len(cached_blocks), num_loaded)
        return needed <= self._available(cached_blocks)

    def allocate(
        self,
        seq: Sequence,
        num_new_tokens: int,
        cached_blocks: list[int] | None = None,
        num_loaded: int = 0,
    ) -> bool:
        """Makes room for the next `num_new_tokens` tokens of `seq`, first adopting
        `cached_blocks` and then `num_loaded` new blocks into which the connector loads the blocks
        after them (a prefix hit for a sequence with no blocks yet). Returns False, changing
        nothing, when too few blocks are free."""
        # Most decodes: the token fits the blocks the sequence has, and none must be copied first.
        fits = seq.num_computed_tokens + num_new_tokens <= len(seq.block_table) * self.block_size
        if fits and not cached_blocks and not num_loaded and self._shared_block(seq) is None:
            return True
        cached_blocks = cached_blocks or []
        if not self.can_allocate(seq, num_new_tokens, cached_blocks, num_loaded):
            return False
        if cached_blocks or num_loaded:
            self.pool.share(cached_blocks)
            seq.block_table = list(cached_blocks)
            if num_loaded:
                self._load(seq, num_loaded)
            seq.num_computed_tokens = len(seq.block_table) * self.block_size
            _changed(seq, 0)
        if (shared := self._shared_block(seq)) is not None:
            src = seq.block_table[shared]
            (dst,) = self.pool.allocate(1)
            self.pool.release([src])
            seq.block_table[shared] = dst
            self._pending_copies.append((src, dst))
            _changed(seq, shared)
        total = seq.num_computed_tokens + num_new_tokens
        missing = -(-total // self.block_size) - len(seq.block_table)
        if missing > 0:
            _changed(seq, len(seq.block_table))
            seq.block_table.extend(self.pool.allocate(missing))
        return True

    def _load(self, seq: Sequence, count: int) -> None:
        """`count` new blocks at the end of the sequence's table, which the connector fills."""
        first = len(seq.block_table)
        block_ids = self.pool.allocate(count)
        seq.block_table.extend(block_ids)
        self.connector.update_state_after_alloc(seq, block_ids)
        self._loading[seq.seq_id] = (seq, first, block_ids)

    def take_connector_meta(self) -> KVConnectorMeta | None:
        """The step's transfers, for the plan; handed over once."""
        if self.connector is None:
            return None
        meta = self.connector.build_connector_meta()  # holds that expired end here
        self._release_held()
        return meta

    @property
    def connector_busy(self) -> bool:
        return self.connector is not None and self.connector.busy

    def _release_held(self) -> None:
        """Blocks the connector kept for another replica, now let go of."""
        if released := self.connector.take_released():
            self.pool.release(list(reversed(released)))

    def take_connector_output(self, output: KVConnectorOutput) -> list[tuple[Sequence, int, int]]:
        """Takes a step's report of the connector: the sequences whose loads ended, each computing
        again from its first block that failed (if one did), with the tokens loaded and those lost;
        the blocks loaded join the prefix cache."""
        self.connector.update_connector_output(output)
        self._release_held()  # the ones another replica has pulled
        failed, ended = set(output.failed_blocks), []
        for seq_id in output.finished_loads:
            if seq_id not in self._loading:  # it left while loading
                continue
            seq, first, block_ids = self._loading.pop(seq_id)
            loaded = next((i for i, block_id in enumerate(block_ids) if block_id in failed), len(block_ids))
            self._register(seq, range(first, first + loaded))
            lost = max(0, seq.num_computed_tokens - (first + loaded) * self.block_size)
            seq.num_computed_tokens -= lost
            ended.append((seq, loaded * self.block_size, lost))
        return ended

    def reset_cache(self) -> bool:
        """Forgets every cached block, on the device and the connector's; False, changing nothing,
        while any block is in use."""
        if not self.pool.reset_cache():
            return False
        if self.connector is not None:
            self.connector.reset()
        if self.events is not None:
            self.events.cleared()
        return True

    def take_events(self) -> list[KVCacheEvent]:
        """The KV events since the last call (the host tier's after the device's); handed over once."""
        if self.events is None:
            return []
        if self.connector is not None:
            self.events.tier_changed(*self.connector.take_events())
        return self.events.take()

    def count_prefix_query(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def count_loaded(self, num_tokens: int) -> None:
        """Prompt tokens the connector supplied (beside the prefix cache's hits)."""
        if num_tokens:
            self.connector.count_hits(num_tokens)

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Registers every block whose tokens have all been computed and kept (are the
        sequence's tokens)."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, seq.num_tokens - seq.num_pending) // self.block_size
        self._extend_hashes(seq, num_full * self.block_size)
        self._register(seq, range(num_full))

    def _register(self, seq: Sequence, indices: range) -> None:
        """Registers the sequence's blocks at these indices that hold no hash yet."""
        new = []
        for index in indices:
            block = self.pool.blocks[seq.block_table[index]]
            if block.block_hash is None and self.pool.register(block.block_id, seq.block_hashes[index]):
                new.append(index)
        if new and self.events is not None:
            self.events.stored(seq, new)

    def _on_evict(self, block_id: int, block_hash: bytes) -> None:
        """A cached block is about to be overwritten: subscribers hear of it, the connector may save it."""
        if self.events is not None:
            self.events.evicted(block_hash)
        if self.connector is not None:
            self.connector.on_evict(block_id, block_hash)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Gives back the blocks past the first `num_tokens` tokens (slots of tokens a step
        computed and did not keep)."""
        keep = -(-num_tokens // self.block_size)
        if keep < len(seq.block_table):
            self.pool.release(list(reversed(seq.block_table[keep:])))
            del seq.block_table[keep:]
            _changed(seq, keep)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares the blocks of the parent's computed tokens (not slots past them,
        into which the two would write at once)."""
        child.block_table = parent.block_table[: -(-parent.num_computed_tokens // self.block_size)]
        self.pool.share(child.block_table)
        _changed(child, 0)

    def free(self, seq: Sequence, pin_s: float = 0.0) -> None:
        """Returns the sequence's blocks; with `pin_s`, its cached ones stay ahead of others in
        the eviction order for that many seconds (its conversation goes on)."""
        self._loading.pop(seq.seq_id, None)
        if self.connector is not None:
            # What it keeps for another replica stays in use until the connector lets it go.
            self.pool.share(self.connector.request_finished(seq))
        pin_until = self.pool.clock() + pin_s if pin_s > 0 else None
        self.pool.release(list(reversed(seq.block_table)), pin_until)
        seq.block_table = []
        _changed(seq, 0)

    def _available(self, cached_blocks: list[int]) -> int:
        # Cached blocks sitting in the free list are about to be taken by this sequence.
        reclaimed = sum(1 for b in cached_blocks if self.pool.ref_count(b) == 0)
        return self.pool.num_free - reclaimed

    def _shared_block(self, seq: Sequence) -> int | None:
        """The index of the partly filled block the next token goes into, when other sequences
        share it (it is copied first); None otherwise."""
        index, offset = divmod(seq.num_computed_tokens, self.block_size)
        if offset and index < len(seq.block_table) and self.pool.ref_count(seq.block_table[index]) > 1:
            return index
        return None

    def _extend_hashes(self, seq: Sequence, num_tokens: int) -> None:
        bs = self.block_size
        for i in range(len(seq.block_hashes), num_tokens // bs):
            parent = seq.block_hashes[i - 1] if i else None
            seq.block_hashes.append(self.hasher(parent, seq.token_ids[i * bs : (i + 1) * bs], seq.request.hash_seed))


def _changed(seq: Sequence, index: int) -> None:
    """Marks the sequence's block table as changed from `index` on."""
    if seq.block_table_changed_from is None or index < seq.block_table_changed_from:
        seq.block_table_changed_from = index
