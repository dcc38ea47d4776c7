"""Scheduling under pressure, as counters: preemptions by cause (Argosy's name carries the
`cause` label, memory or priority; vLLM's has the total only), the tokens preempted sequences
computed again, and, with a host KV tier, its usage, the blocks stored into it and loaded back,
and the prompt tokens found there (beside the prefix cache's hits). The engine reports
cumulative totals; the counters advance by the difference."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from argosy.server.outputs import EngineStats

CAUSES = ("memory", "priority")


class SchedulingMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str):
        self.model_name = model_name

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, ["model_name", *extra], registry=registry)

        doc = "Sequences preempted, by cause: memory (no free KV blocks) or priority (a request ahead needed the room)"
        self.preemptions = counter("argosy_num_preemptions", doc, ("cause",))
        self.vllm_preemptions = counter(
            "vllm:num_preemptions", "Sequences preempted (argosy_num_preemptions_total has the cause)"
        )
        self.recomputed = counter(
            "argosy_recomputed_tokens",
            "Tokens preempted sequences computed again (with the host tier, at most a partial block per preemption)",
        )
        self.host_usage = Gauge(
            "argosy_kv_host_usage_ratio",
            "With --swap-space: fraction of the host KV tier in use",
            ["model_name"],
            registry=registry,
        )
        self.host_stored = counter(
            "argosy_kv_host_blocks_stored", "With --swap-space: KV blocks copied into the host tier"
        )
        self.host_loaded = counter(
            "argosy_kv_host_blocks_loaded", "With --swap-space: KV blocks loaded back from the host tier"
        )
        self.host_hits = counter(
            "argosy_kv_host_hits",
            "With --swap-space: prompt tokens found in the host KV tier (beside the device's hits)",
        )
        for cause in CAUSES:
            self.preemptions.labels(model_name, cause)
        self.vllm_preemptions.labels(model_name)
        self.recomputed.labels(model_name)
        self._last = EngineStats(0, 0, 1, 0, 0, 0, 0)

    def sync(self, stats: EngineStats) -> None:
        model, last = self.model_name, self._last
        for cause, value in stats.preemptions.items():
            if (delta := value - last.preemptions.get(cause, 0)) > 0:
                self.preemptions.labels(model, cause).inc(delta)
                self.vllm_preemptions.labels(model).inc(delta)
        _advance(self.recomputed.labels(model), stats.recomputed_tokens, last.recomputed_tokens)
        host, before = stats.kv_host, last.kv_host
        if host is not None:
            self.host_usage.labels(model).set(host.usage)
            for metric, value, was in (
                (self.host_stored, host.blocks_stored, before and before.blocks_stored),
                (self.host_loaded, host.blocks_loaded, before and before.blocks_loaded),
                (self.host_hits, host.hit_tokens, before and before.hit_tokens),
            ):
                _advance(metric.labels(model), value, was or 0)
        self._last = stats


def _advance(counter, value: int, before: int) -> None:
    if value > before:
        counter.inc(value - before)
