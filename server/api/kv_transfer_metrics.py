"""Prefill/decode hand-off counters: blocks pulled and sent, bytes moved, the pulls' wall time, and
what went wrong (holds that expired unpulled, pulls that found nobody, pulls refused). The engine
reports cumulative totals; the counters advance by the difference."""

from __future__ import annotations

from dataclasses import fields

from prometheus_client import CollectorRegistry, Counter

from argosy.server.kv_transfer.transfer_scheduler import TransferStats

DOCS = {
    "blocks_pulled": ("argosy_kv_transfer_blocks", "KV blocks moved between replicas", {"direction": "pulled"}),
    "blocks_sent": ("argosy_kv_transfer_blocks", "KV blocks moved between replicas", {"direction": "sent"}),
    "bytes_moved": ("argosy_kv_transfer_bytes", "Bytes of KV blocks moved between replicas, in and out", {}),
    "seconds": ("argosy_kv_transfer_seconds", "Wall time of the pulls, from request to blocks received", {}),
    "holds_expired": ("argosy_kv_transfer_holds_expired", "Prefills whose blocks were let go unpulled", {}),
    "pulls_failed": ("argosy_kv_transfer_pulls_failed", "Pulls that got no answer: the prompt computed here", {}),
    "pulls_refused": ("argosy_kv_transfer_pulls_refused", "Pulls refused (forged or stale params): a 400", {}),
}


class KVTransferMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        self.model_name = model_name
        self._counters: dict[str, Counter] = {}
        for name, doc, extra in DOCS.values():
            if name not in self._counters:
                self._counters[name] = Counter(name, doc, ["model_name", *extra], registry=registry)
        self._last = TransferStats()

    def sync(self, stats: TransferStats) -> None:
        for field in fields(TransferStats):
            value, before = getattr(stats, field.name), getattr(self._last, field.name)
            if value > before:
                name, _, extra = DOCS[field.name]
                self._counters[name].labels(model_name=self.model_name, **extra).inc(value - before)
        self._last = stats
