"""Prometheus metrics of one server, in its own registry, every series labelled with the
served model name. Gauges are read at scrape time; counters and histograms are fed by the
engine client after each core message. Each series of the model-server protocol is exported
twice, fed together: under Argosy's name and under vLLM's (VLLM_NAMES), which gateways'
endpoint pickers and dashboards read. The engine core's own health (its steps, and how long it
has owed a message) has Argosy's names only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from argosy.server.api.kv_transfer_metrics import KVTransferMetrics
from argosy.server.api.scheduling_metrics import SchedulingMetrics
from argosy.server.api.spec_decode_metrics import SpecDecodeMetrics
from argosy.server.interface import GENERATION_TOKENS_METRIC, KV_USAGE_METRIC, RUNNING_METRIC, WAITING_METRIC
from argosy.server.outputs import EngineStats, LoRAStats, RequestOutput
from argosy.server.structured.params import KINDS

_LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
)
# Engine steps: milliseconds on a GPU, up to the watchdog's default timeout on a slow CPU.
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
HANG_KINDS = ("step", "ping", "control")


VLLM_NAMES = {
    WAITING_METRIC: "vllm:num_requests_waiting",
    RUNNING_METRIC: "vllm:num_requests_running",
    KV_USAGE_METRIC: "vllm:kv_cache_usage_perc",
    "argosy_prompt_tokens_total": "vllm:prompt_tokens_total",
    GENERATION_TOKENS_METRIC: "vllm:generation_tokens_total",
    "argosy_request_success_total": "vllm:request_success_total",
    "argosy_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "argosy_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "argosy_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "argosy_inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
    "argosy_e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
    "argosy_request_queue_time_seconds": "vllm:request_queue_time_seconds",
}


class Twins:
    """One series under both names: what is done to a child is done to both."""

    def __init__(self, *metrics):
        self.metrics = metrics

    def labels(self, **labels) -> Twins:
        return Twins(*(m.labels(**labels) for m in self.metrics))

    def inc(self, amount: float = 1) -> None:
        for m in self.metrics:
            m.inc(amount)

    def observe(self, value: float) -> None:
        for m in self.metrics:
            m.observe(value)

    def set_function(self, read) -> None:
        for m in self.metrics:
            m.set_function(read)


@dataclass
class ServerMetrics:
    model_name: str
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels, r = ["model_name"], self.registry

        def gauge(name: str, doc: str) -> Twins:
            return Twins(*(Gauge(n, doc, labels, registry=r) for n in (name, VLLM_NAMES[name])))

        def counter(name: str, doc: str, extra: tuple[str, ...] = (), vllm_name: str | None = None) -> Twins:
            names = (name, vllm_name or VLLM_NAMES[name])
            return Twins(*(Counter(n.removesuffix("_total"), doc, labels + list(extra), registry=r) for n in names))

        def histogram(name: str, doc: str) -> Twins:
            names = (name, VLLM_NAMES[name])
            return Twins(*(Histogram(n, doc, labels, buckets=_LATENCY_BUCKETS, registry=r) for n in names))

        self.waiting = gauge(WAITING_METRIC, "Requests accepted and waiting to be scheduled (the autoscaling signal)")
        self.running = gauge(RUNNING_METRIC, "Requests in the running batch")
        self.kv_usage = gauge(KV_USAGE_METRIC, "Fraction of KV-cache blocks in use, 0 to 1")
        self.prompt_tokens = counter(
            "argosy_prompt_tokens_total", "Prompt tokens of served requests, counted at their first token"
        )
        self.generation_tokens = counter(GENERATION_TOKENS_METRIC, "Generated tokens")
        self.success = counter(
            "argosy_request_success_total",
            "Ended requests, one per prompt, by finished_reason: stop, length or abort",
            ("finished_reason",),
        )
        self.prefix_queries = counter(
            "argosy_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache"
        )
        self.prefix_hits = counter(
            "argosy_prefix_cache_hits_total",
            "Prompt tokens found in the prefix cache (a response's usage.prompt_tokens_details.cached_tokens)",
        )
        self.ttft = histogram("argosy_time_to_first_token_seconds", "Time from arrival to the first token")
        self.itl = histogram("argosy_inter_token_latency_seconds", "Time between a request's successive tokens")
        self.e2e = histogram("argosy_e2e_request_latency_seconds", "Time from arrival to the last token")
        self.queue_time = histogram("argosy_request_queue_time_seconds", "Time from arrival to first scheduling")
        self.steps = Counter("argosy_engine_steps", "Steps the engine core has run", labels, registry=r)
        self.pinned_blocks = Gauge(
            "argosy_kv_cache_pinned_blocks",
            "Free KV-cache blocks kept ahead of others in the eviction order (stored conversations' turns)",
            labels,
            registry=r,
        )
        self.kv_events_dropped = Counter(
            "argosy_kv_events_dropped",
            "KV event batches dropped, unsent, because the publisher's queue was full (a subscriber fell behind)",
            labels,
            registry=r,
        )
        self.step_duration = Histogram(
            "argosy_engine_step_duration_seconds",
            "Wall time of one engine step (schedule, forward pass, sampling)",
            labels,
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.stall = Gauge(
            "argosy_engine_stall_seconds",
            "How long the engine core has owed a message (a step's end, or a ping's answer); past "
            "--engine-step-timeout it is hung",
            labels,
            registry=r,
        )
        self.hangs = Counter(
            "argosy_engine_hangs",
            "Engine core hangs detected, by what it owed: a step's end (step), a ping's answer (ping), or a weight "
            "update's or wake-up's end within an hour (control)",
            [*labels, "waiting_for"],
            registry=r,
        )
        self.lora_config_errors = Counter(
            "argosy_lora_config_file_errors",
            "Entries of --lora-config-file that could not be applied (each is logged), and unreadable reads",
            labels,
            registry=r,
        )
        self.grammar_compile = Histogram(
            "argosy_grammar_compile_seconds",
            "Time to compile a constraint's grammar (once per distinct constraint while it stays cached)",
            labels,
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.structured_requests = Counter(
            "argosy_structured_requests",
            "Requests whose output is held to a constraint, by its kind",
            [*labels, "kind"],
            registry=r,
        )
        self.weight_version = Gauge(
            "argosy_weight_version",
            "Weight updates applied since start; the label names the version serving",
            [*labels, "version"],
            registry=r,
        )
        self.set_weight_version("0", 0)
        self.spec_decode = SpecDecodeMetrics(counter, self.model_name)
        self.scheduling = SchedulingMetrics(r, self.model_name)
        self.kv_transfer = KVTransferMetrics(r, self.model_name)
        # Every series present from the start, at 0, as vLLM has them: rate() needs a first sample.
        for series in (
            self.prompt_tokens,
            self.generation_tokens,
            self.prefix_queries,
            self.prefix_hits,
            self.ttft,
            self.itl,
            self.e2e,
            self.queue_time,
            self.steps,
            self.step_duration,
            self.grammar_compile,
        ):
            self.label(series)
        for kind in KINDS:
            self.structured_requests.labels(model_name=self.model_name, kind=kind)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name=self.model_name, finished_reason=reason)
        for kind in HANG_KINDS:
            self.hangs.labels(model_name=self.model_name, waiting_for=kind)
        self._last_token_time: dict[str, float] = {}  # of each request in flight that has one
        self._engine_totals = (0, 0, 0)
        self._num_steps = 0
        self._refresh_lora: Callable[[], None] | None = None

    def label(self, metric):
        return metric.labels(model_name=self.model_name)

    def describe_cache(self, block_size: int, num_blocks: int, prefix_caching: bool) -> None:
        """vLLM's `cache_config_info`: the KV cache's shape as labels (value 1), which prefix-aware
        routing reads."""
        names = ["model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching"]
        doc = "The KV cache's shape as labels, value 1 (num_gpu_blocks is its block count on CPUs too)"
        info = Gauge("vllm:cache_config_info", doc, names, registry=self.registry)
        values = (self.model_name, str(block_size), str(num_blocks), str(prefix_caching))
        info.labels(*values).set(1)

    def bind_lora(self, read: Callable[[], LoRAStats | None]) -> None:
        """With LoRA on: vLLM's `lora_requests_info`, whose value is when its labels were last
        true (the Inference Extension's LoRA-affinity scorer reads the newest series: the old
        one goes when the labels change), and `argosy_lora_adapters_loaded{adapter, tier}`,
        which shows adapters loaded but idle too."""
        names = ["max_lora", "waiting_lora_adapters", "running_lora_adapters"]
        doc = "Adapters of the running and waiting requests; the value is when the labels were last true"
        info = Gauge("vllm:lora_requests_info", doc, names, registry=self.registry)
        loaded = Gauge(
            "argosy_lora_adapters_loaded",
            "LoRA adapters loaded: in a device slot (tier device) or in host memory only (tier host)",
            ["model_name", "adapter", "tier"],
            registry=self.registry,
        )
        last: list[tuple[str, ...]] = []

        def refresh() -> None:
            stats = read()
            if stats is None:
                return
            labels = (str(stats.max_loras), ",".join(stats.waiting), ",".join(stats.running))
            if last and last[0] != labels:
                info.remove(*last[0])
            last[:] = [labels]
            info.labels(*labels).set_to_current_time()
            loaded.clear()
            for tier, adapters in (("device", stats.device), ("host", stats.host)):
                for adapter in adapters:
                    loaded.labels(self.model_name, adapter, tier).set(1)

        self._refresh_lora = refresh

    def set_weight_version(self, version: str, updates: int) -> None:
        self.weight_version.clear()
        self.weight_version.labels(model_name=self.model_name, version=version).set(updates)

    def count_lora_config_error(self, message: str) -> None:
        self.lora_config_errors.labels(model_name=self.model_name).inc()

    def bind_gauges(self, num_waiting, num_running, kv_usage, stall_seconds) -> None:
        """Gauges read these callables whenever Prometheus scrapes."""
        self.label(self.waiting).set_function(num_waiting)
        self.label(self.running).set_function(num_running)
        self.label(self.kv_usage).set_function(kv_usage)
        self.label(self.stall).set_function(stall_seconds)

    def observe_step(self, deltas: list[RequestOutput], now: float) -> None:
        """Counts one step's outputs (DELTA outputs: each holds only the step's new tokens)."""
        for out in deltas:
            new = sum(len(c.token_ids) for c in out.outputs)
            if new > 0:
                last = self._last_token_time.get(out.request_id)
                if last is None:
                    self.label(self.prompt_tokens).inc(len(out.prompt_token_ids))
                    m = out.metrics
                    self.label(self.ttft).observe(now - m.arrival_time)
                    self.label(self.queue_time).observe((m.first_scheduled_time or now) - m.arrival_time)
                else:
                    self.label(self.itl).observe(now - last)
                self.label(self.generation_tokens).inc(new)
                self._last_token_time[out.request_id] = now
            if out.finished:
                self._last_token_time.pop(out.request_id, None)
                self.label(self.e2e).observe(now - out.metrics.arrival_time)
                # One count per request; with n > 1 the first sequence's reason stands for it.
                self._count_finished(out.outputs[0].finish_reason)

    def observe_abort(self, request_id: str) -> None:
        self.forget(request_id)
        self._count_finished("abort")

    def forget(self, request_id: str) -> None:
        """A request that failed: it ends uncounted."""
        self._last_token_time.pop(request_id, None)

    def observe_engine_step(self, num_steps: int, seconds: float | None) -> None:
        """`num_steps`: the core's total so far; `seconds`: its latest step's, if one ran."""
        if num_steps > self._num_steps:
            self.label(self.steps).inc(num_steps - self._num_steps)
            self._num_steps = num_steps
        if seconds is not None:
            self.label(self.step_duration).observe(seconds)

    def count_structured(self, kind: str) -> None:
        self.structured_requests.labels(model_name=self.model_name, kind=kind).inc()

    def observe_grammar_compiles(self, seconds: list[float]) -> None:
        for value in seconds:
            self.label(self.grammar_compile).observe(value)

    def count_hang(self, waiting_for: str) -> None:
        self.hangs.labels(model_name=self.model_name, waiting_for=waiting_for).inc()

    def _count_finished(self, reason: str | None) -> None:
        self.success.labels(model_name=self.model_name, finished_reason=reason).inc()

    def sync_engine_counters(self, stats: EngineStats) -> None:
        """Engine totals are cumulative; the counters advance by the difference."""
        last = self._engine_totals
        totals = (stats.prefix_cache_queries, stats.prefix_cache_hits, stats.kv_events_dropped)
        for metric, value, before in zip((self.prefix_queries, self.prefix_hits, self.kv_events_dropped), totals, last):
            if value > before:
                self.label(metric).inc(value - before)
        self._engine_totals = totals
        self.label(self.pinned_blocks).set(stats.kv_blocks_pinned)
        self.scheduling.sync(stats)
        if stats.spec_decode is not None:
            self.spec_decode.sync(stats.spec_decode)
        if stats.kv_transfer is not None:
            self.kv_transfer.sync(stats.kv_transfer)

    def render(self) -> bytes:
        if self._refresh_lora is not None:
            self._refresh_lora()
        return generate_latest(self.registry)
