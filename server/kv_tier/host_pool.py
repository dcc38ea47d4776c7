"""HostBlockPool: the engine's account of the host tier, in block hashes only (the bytes live
on the device side, in HostKVCache). It is a bounded pool of slots keyed by the same chained
block hashes as the device's prefix cache. A block the device evicts from its prefix cache is
stored here (a preempted sequence's full blocks end that way too, once their blocks are taken),
the least recently used entry making room; a sequence whose next blocks are here loads them
instead of computing them again.

Copies are decided here and made by the device side before the step's forward pass, stores
before loads. A slot that a step loads from is locked until the step's copies are taken, so
that no store of the same step overwrites it first."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class HostTierStats:
    blocks_total: int
    blocks_used: int
    blocks_stored: int  # copies into the tier so far
    blocks_loaded: int  # copies out of it so far
    hit_tokens: int  # prompt tokens found in the tier (beside the prefix cache's hits)

    @property
    def usage(self) -> float:
        return self.blocks_used / self.blocks_total


class HostBlockPool:
    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"the host tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._slots: OrderedDict[bytes, int] = OrderedDict()  # least recently used first
        self._free = list(range(num_blocks - 1, -1, -1))
        self._locked: set[int] = set()
        self._stores: list[tuple[int, int]] = []  # (device block, host slot)
        self._loads: list[tuple[int, int]] = []  # (host slot, device block)
        self._taken_in: list[bytes] = []  # hashes stored since the last take_changes, for KV events
        self._let_go: list[bytes] = []  # hashes whose slots were taken for others since then
        self.blocks_stored = self.blocks_loaded = self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._slots

    def store(self, block_id: int, block_hash: bytes) -> None:
        """The device is about to reuse `block_id`, whose contents have this hash: they are
        copied here first, unless they are here already (then they count as used now) or
        every slot is locked by this step's loads (then they are dropped)."""
        if block_hash in self._slots:
            self._slots.move_to_end(block_hash)
            return
        slot = self._take_slot()
        if slot is None:
            return
        self._slots[block_hash] = slot
        self._stores.append((block_id, slot))
        self._taken_in.append(block_hash)
        self.blocks_stored += 1

    def hits(self, block_hashes: list[bytes]) -> int:
        """How many of these hashes, from the first on, the tier holds."""
        count = 0
        for block_hash in block_hashes:
            if block_hash not in self._slots:
                break
            count += 1
        return count

    def lock(self, block_hashes: list[bytes]) -> None:
        """Keeps these held blocks (as just used) until the step's copies are taken: they are
        about to be loaded."""
        for block_hash in block_hashes:
            self._slots.move_to_end(block_hash)
            self._locked.add(self._slots[block_hash])

    def load(self, block_hash: bytes, block_id: int) -> None:
        """Copies a locked block into device block `block_id` before the step's forward pass."""
        self._loads.append((self._slots[block_hash], block_id))
        self.blocks_loaded += 1

    def take_copies(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The step's (stores, loads), handed over once; its slots are unlocked."""
        stores, loads = self._stores, self._loads
        self._stores, self._loads, self._locked = [], [], set()
        return stores, loads

    def take_changes(self) -> tuple[list[bytes], list[bytes]]:
        """The hashes taken in and let go since the last call; handed over once."""
        changes = self._taken_in, self._let_go
        self._taken_in, self._let_go = [], []
        return changes

    def clear(self) -> None:
        """Forgets every block (the weights changed, or the cache was reset)."""
        self._slots.clear()
        self._free = list(range(self.num_blocks - 1, -1, -1))
        self._taken_in, self._let_go = [], []

    def stats(self) -> HostTierStats:
        return HostTierStats(self.num_blocks, len(self._slots), self.blocks_stored, self.blocks_loaded, self.hit_tokens)

    def _take_slot(self) -> int | None:
        if self._free:
            return self._free.pop()
        for block_hash, slot in self._slots.items():  # least recently used first
            if slot not in self._locked:
                del self._slots[block_hash]
                self._let_go.append(block_hash)
                return slot
        return None
