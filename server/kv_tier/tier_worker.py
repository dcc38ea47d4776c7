"""The host tier as a KV connector, its worker half (HostTierWorker): each step's stores, then
its loads, between the device's KV cache and the host's slots (HostKVCache: on CUDA a side stream
whose loads the next step waits for), made before the forward pass. A load is done once made:
the sequences it was for are reported finished in the same step's result."""

from __future__ import annotations

import torch

from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_tier.host_cache import HostKVCache
from argosy.server.kv_tier.tier_scheduler import HostTierMeta


class HostTierWorker:
    def __init__(self, num_slots: int, block_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.cache = HostKVCache(num_slots, block_shape, dtype, device)
        self._finished: list[int] = []

    def start(self, kv_cache: torch.Tensor, meta: HostTierMeta | None) -> None:
        """Also at a step with no copies: on CUDA the step waits there for the last step's loads."""
        if meta is None:
            self.cache.copy(kv_cache, [], [])
            return
        self.cache.copy(kv_cache, meta.stores, meta.loads)
        self._finished += meta.load_seqs

    def finished(self, wait: float = 0.0) -> KVConnectorOutput:  # its loads are done in their step
        done, self._finished = self._finished, []
        return KVConnectorOutput(done)
