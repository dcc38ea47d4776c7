"""KVEventRecorder: turns the KV cache's changes into a step's events. The KV-cache manager tells it
which blocks of a sequence entered the device's prefix cache and which hashes the device evicted;
the host tier tells it which hashes it took in and let go; a reset clears everything. It keeps
what it announced of each cached block (parent, tokens, adapter) by hash, so that a block the host
tier takes in is announced with its tokens too, and forgets a block once no tier holds it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from argosy.server.kv_events.wire import (
    MEDIUM_DEVICE,
    MEDIUM_HOST,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    external_hash,
)

if TYPE_CHECKING:
    from argosy.server.engine.sequence import Sequence
    from argosy.server.lora.request import AdapterRef


@dataclass
class CachedBlock:
    parent: bytes | None
    token_ids: list[int]
    lora: AdapterRef | None
    media: set[str] = field(default_factory=set)


def lora_id(ref: AdapterRef | None) -> int | None:
    """A stable id for an adapter, the same on every replica: its digest's first 4 bytes."""
    return None if ref is None else int(ref.digest[:8], 16)


class KVEventRecorder:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self._blocks: dict[bytes, CachedBlock] = {}
        self._events: list[KVCacheEvent] = []
        self._unheld: list[bytes] = []  # blocks no tier may hold any more: forgotten at `take`

    def stored(self, seq: Sequence, indices: list[int]) -> None:
        """The sequence's blocks at these indices (ascending) entered the device's prefix cache:
        one event per run of consecutive blocks, as vLLM sends them."""
        runs: list[list[int]] = []
        for index in indices:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        bs, lora = self.block_size, seq.request.lora
        for run in runs:
            for index in run:
                parent = seq.block_hashes[index - 1] if index else None
                tokens = seq.token_ids[index * bs : (index + 1) * bs]
                block = self._blocks.setdefault(seq.block_hashes[index], CachedBlock(parent, tokens, lora))
                block.media.add(MEDIUM_DEVICE)
            first = run[0]
            self._events.append(
                BlockStored(
                    [external_hash(seq.block_hashes[i]) for i in run],
                    external_hash(seq.block_hashes[first - 1]) if first else None,
                    seq.token_ids[first * bs : (run[-1] + 1) * bs],
                    bs,
                    lora_id(lora),
                    MEDIUM_DEVICE,
                    None if lora is None else lora.name,
                )
            )

    def evicted(self, block_hash: bytes) -> None:
        """The device is about to overwrite this cached block."""
        self._removed([block_hash], MEDIUM_DEVICE)

    def tier_changed(self, stored: list[bytes], removed: list[bytes]) -> None:
        """The host tier took in these blocks (hashes the device announced) and let go of those."""
        self._removed(removed, MEDIUM_HOST)
        for block_hash in stored:
            block = self._blocks.get(block_hash)
            if block is None or MEDIUM_HOST in block.media:
                continue
            block.media.add(MEDIUM_HOST)
            parent = None if block.parent is None else external_hash(block.parent)
            lora = block.lora
            self._events.append(
                BlockStored(
                    [external_hash(block_hash)],
                    parent,
                    block.token_ids,
                    self.block_size,
                    lora_id(lora),
                    MEDIUM_HOST,
                    None if lora is None else lora.name,
                )
            )

    def cleared(self) -> None:
        self._blocks.clear()
        self._unheld.clear()
        self._events.append(AllBlocksCleared())

    def take(self) -> list[KVCacheEvent]:
        """The events since the last call, in the order they happened; handed over once."""
        for block_hash in self._unheld:
            if (block := self._blocks.get(block_hash)) is not None and not block.media:
                del self._blocks[block_hash]
        events, self._events, self._unheld = self._events, [], []
        return events

    def _removed(self, hashes: list[bytes], medium: str) -> None:
        gone = []
        for block_hash in hashes:
            block = self._blocks.get(block_hash)
            if block is None or medium not in block.media:
                continue
            block.media.discard(medium)
            if not block.media:  # kept until `take`: the host tier may take it in within the step
                self._unheld.append(block_hash)
            gone.append(external_hash(block_hash))
        if gone:
            self._events.append(BlockRemoved(gone, medium))
