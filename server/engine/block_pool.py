"""BlockPool: the KV cache's fixed-size blocks, their reference counts, and the prefix
cache that maps a full block's content hash to the block holding it.

A block with reference count 0 is free, but keeps its contents and its hash until it is
handed out again, so a later request with the same prefix can still reuse it. Free blocks
are handed out least recently freed first. A cached block's contents that are about to be
overwritten are first offered to `on_evict` (the host tier keeps them)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None  # set once the block is full and registered


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool, on_evict: Callable[[int, bytes], None] | None = None):
        self.on_evict = on_evict  # (block id, hash) of cached contents about to be overwritten
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.enable_caching = enable_caching
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int]:
        """Hands out `count` free blocks (caller checks num_free first), evicting their
        cached contents."""
        if count > len(self._free):
            raise RuntimeError(f"asked for {count} blocks with only {len(self._free)} free")
        ids = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
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
                del self._free[block_id]
            block.ref_count += 1

    def release(self, block_ids: list[int]) -> None:
        """Drops one reference from each block; blocks left unreferenced become free, in the
        order given, so callers pass tail blocks first to have them evicted first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"block {block_id} released more often than taken")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

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
        if len(self._free) != len(self.blocks):
            return False
        for block in self.blocks:
            block.block_hash = None
        self._cached.clear()
        return True

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count
