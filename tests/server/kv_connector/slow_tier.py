"""SlowHostTier: a KV connector for tests, plugged in by module path as any connector outside the
project would be. It is the host tier, with each step's loads reported done only `delay_steps`
steps later; with `fail: true` the loads reported failed, their blocks first overwritten with
noise, so that a sequence that read them anyway would give other tokens; with `lie: true` the
noise reported as loads done (what the engine must never be given, to show that it would tell)."""

from __future__ import annotations

import torch

from argosy.server.kv_connector.config import KVTransferConfig
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.kv_tier.host_connector import HostTierConnector
from argosy.server.kv_tier.tier_scheduler import HostTierMeta
from argosy.server.kv_tier.tier_worker import HostTierWorker


class SlowHostTier(HostTierConnector):
    @staticmethod
    def worker(config: KVTransferConfig, *args) -> tuple[SlowTierWorker | None, int]:
        half, slots = HostTierConnector.worker(config, *args)
        extra = config.kv_connector_extra_config
        if half is None:
            return None, slots
        return SlowTierWorker(half, extra["delay_steps"], extra.get("fail", False), extra.get("lie", False)), slots


class SlowTierWorker:
    def __init__(self, tier: HostTierWorker, delay_steps: int, fail: bool, lie: bool):
        self.tier, self.delay_steps, self.fail, self.lie = tier, delay_steps, fail, lie
        self.pending: list[list] = []  # [steps left, the loads' meta]
        self.kv_cache: torch.Tensor | None = None

    def start(self, kv_cache: torch.Tensor, meta: HostTierMeta | None) -> None:
        self.tier.start(kv_cache, meta)
        self.kv_cache = kv_cache
        if meta is not None and meta.load_seqs:
            self.pending.append([self.delay_steps, meta])

    def finished(self, wait: float = 0.0) -> KVConnectorOutput:
        self.tier.finished()  # made already: reported here, later
        out = KVConnectorOutput()
        for entry in self.pending:
            entry[0] -= 1
        for _, meta in [entry for entry in self.pending if entry[0] <= 0]:
            out.finished_loads += meta.load_seqs
            if self.fail or self.lie:
                blocks = [block for _, block in meta.loads]
                self.kv_cache[:, :, blocks] = torch.randn_like(self.kv_cache[:, :, blocks]) * 100
                out.failed_blocks += [] if self.lie else blocks
        self.pending = [entry for entry in self.pending if entry[0] > 0]
        return out
