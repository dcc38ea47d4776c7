"""BlockPool: the KV cache's fixed-size blocks, their reference counts, and the prefix
cache that maps a full block's content hash to the block holding it.

A block with reference count 0 is free, but keeps its contents and its hash until it is
handed out again, so a later request with the same prefix can still reuse it. Free blocks
are handed out least recently freed first. A cached block's contents that are about to be
overwritten are first offered to `on_evict` (the host tier keeps them).

A request that will be continued (a stored conversation's next turn) may pin its blocks as it
ends: they stay free but are handed out only once no unpinned free block is left, until their
pin ends (then they are the first to go). At most PIN_CAP of the blocks are pinned at once: a
pin beyond it is a plain release."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

PIN_CAP = 0.5  # the fraction of the blocks that may be pinned at once


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # set once the block is full and registered


class BlockPool:
    def __init__(
        self,
        num_blocks: int,
        enable_caching: bool,
        on_evict: Callable[[int, bytes], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.on_evict = on_evict  # (block id, hash) of cached contents about to be overwritten
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self.clock = clock
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._pinned: OrderedDict[int, float] = OrderedDict()  # free, kept until then; in pinning order
        # No pin ends before this: a step's allocations and stats look at the pins only from then on.
        self._next_unpin = math.inf
        self._cached: dict[bytes, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free) + len(self._pinned)

    @property
    def num_pinned(self) -> int:
        self._unpin_expired()
        return len(self._pinned)

    def allocate(self, count: int) -> list[int]:
        """Hands out `count` free blocks (caller checks num_free first), evicting their
        cached contents: unpinned ones first."""
        if count > self.num_free:
            raise RuntimeError(f"asked for {count} blocks with only {self.num_free} free")
        self._unpin_expired()
        ids = []
        for _ in range(count):
            block_id, _ = (self._free if self._free else self._pinned).popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                if self._cached.get(block.block_hash) == block_id:
                    del self._cached[block.block_hash]
                    if self.on_evict is not None:
                        self.on_evict(block_id, block.block_hash)
                block.block_hash = None
            block.ref_count = 1
            ids.append(block_id)
        return ids

    def share(self, block_ids: list[int]) -> None:
        """Adds a reference to blocks already holding wanted contents (prefix hits, forks)."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                (self._free if block_id in self._free else self._pinned).pop(block_id)
            block.ref_count += 1

    def release(self, block_ids: list[int], pin_until: float | None = None) -> None:
        """Drops one reference from each block; blocks left unreferenced become free, in the
        order given, so callers pass tail blocks first to have them evicted first. With
        `pin_until` (on the pool's clock), those holding cached contents are pinned until then."""
        cap = int(PIN_CAP * len(self.blocks))
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} released more often than taken")
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if pin_until is not None and block.block_hash is not None and len(self._pinned) < cap:
                self._pinned[block_id] = pin_until
                self._next_unpin = min(self._next_unpin, pin_until)
            else:
                self._free[block_id] = None

    def _unpin_expired(self) -> None:
        """Blocks whose pin has ended become the first free blocks to go."""
        now = self.clock()
        if now < self._next_unpin:
            return
        for block_id in [b for b, until in self._pinned.items() if until <= now]:
            del self._pinned[block_id]
            self._free[block_id] = None
            self._free.move_to_end(block_id, last=False)
        self._next_unpin = min(self._pinned.values(), default=math.inf)

    def lookup(self, block_hash: bytes) -> int | None:
        return self._cached.get(block_hash) if self.enable_caching else None

    def register(self, block_id: int, block_hash: bytes) -> bool:
        """Records a now-full block under its content hash; True if it is the cached copy now,
        False if another block already holds the same contents (that one stays the cached copy)."""
        if not self.enable_caching:
            return False
        self.blocks[block_id].block_hash = block_hash
        return self._cached.setdefault(block_hash, block_id) == block_id

    def reset_cache(self) -> bool:
        """Forgets every cached block; False, changing nothing, while any block is in use."""
        if self.num_free != len(self.blocks):
            return False
        self._free.update(self._pinned.fromkeys(self._pinned))
        self._pinned.clear()
        self._next_unpin = math.inf
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count
