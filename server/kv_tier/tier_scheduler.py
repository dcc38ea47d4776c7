"""The host tier as a KV connector, its engine half (HostTierScheduler): a sequence's blocks after
the device's prefix-cache hits that the host tier holds are loaded into the blocks taken for them
(the slots they load from locked until the step's copies are made), and a cached block the device
is about to overwrite is stored there first. Each step's copies go to the device side as a
HostTierMeta, stores before loads. The bookkeeping is HostBlockPool's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from argosy.server.kv_connector.config import KVTransferConfig
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_tier.host_pool import HostBlockPool, HostTierStats

if TYPE_CHECKING:
    from argosy.server.engine.sequence import Sequence


class HostTierMeta(msgspec.Struct, tag="host_tier", array_like=True):
    stores: list[tuple[int, int]] = []  # (device block, slot), first
    loads: list[tuple[int, int]] = []  # (slot, device block), then
    load_seqs: list[int] = []  # the sequences these loads are for


def swap_space_of(config: KVTransferConfig) -> float:
    """The host tier's GiB, from its extra config."""
    return float(config.kv_connector_extra_config.get("swap_space", 0))


class HostTierScheduler:
    def __init__(self, num_blocks: int, block_size: int):
        self.pool = HostBlockPool(num_blocks)
        self.block_size = block_size
        self._load_seqs: list[int] = []

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_blocks: int) -> int:
        hashes = seq.block_hashes[num_computed_blocks : (seq.num_tokens - 1) // self.block_size]
        hits = hashes[: self.pool.hits(hashes)]
        self.pool.lock(hits)  # until the step's copies are made: no store of this step displaces them
        return len(hits) * self.block_size

    def update_state_after_alloc(self, seq: Sequence, block_ids: list[int]) -> None:
        first = len(seq.block_table) - len(block_ids)
        for block_hash, block_id in zip(seq.block_hashes[first:], block_ids):
            self.pool.load(block_hash, block_id)
        self._load_seqs.append(seq.seq_id)

    def on_evict(self, block_id: int, block_hash: bytes) -> None:
        self.pool.store(block_id, block_hash)

    def build_connector_meta(self) -> HostTierMeta | None:
        stores, loads = self.pool.take_copies()
        seqs, self._load_seqs = self._load_seqs, []
        return HostTierMeta(stores, loads, seqs) if stores or loads else None

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        pass  # its loads are copies made in their step: nothing here waits for them

    def request_finished(self, seq: Sequence) -> list[int]:
        return []

    def take_released(self) -> list[int]:
        return []

    def take_refused(self) -> list[tuple[str, str]]:
        return []

    def transfer_params(self, seq: Sequence) -> None:
        return None

    @property
    def busy(self) -> bool:
        return False  # its copies are made in their step

    def take_events(self) -> tuple[list[bytes], list[bytes]]:
        return self.pool.take_changes()

    def count_hits(self, num_tokens: int) -> None:
        self.pool.hit_tokens += num_tokens

    def reset(self) -> None:
        self.pool.clear()

    def stats(self) -> HostTierStats:
        return self.pool.stats()
