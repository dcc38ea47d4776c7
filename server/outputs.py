"""What the engine hands back: RequestOutput (one per prompt) holding CompletionOutput
(one per sampled sequence), shaped as vLLM's; and EngineStats, its live figures."""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.server.kv_tier.host_pool import HostTierStats
from argosy.server.kv_transfer.transfer_scheduler import TransferStats
from argosy.server.spec_decode.speculator import SpecDecodeStats


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop", "length" or "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass
class RequestMetrics:
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = field(default=None, repr=False)
    kv_transfer_params: dict | None = None  # a prefill's answer to the decode side: where its blocks are


@dataclass(frozen=True)
class LoRAStats:
    """The adapters by name: of the requests running and waiting, and loaded, by tier."""

    max_loras: int
    running: list[str]
    waiting: list[str]
    device: list[str]  # in a device slot
    host: list[str]  # in host memory only


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int
    num_running: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    num_preemptions: int
    preemptions: dict[str, int] = field(default_factory=dict)  # by cause: memory, priority
    recomputed_tokens: int = 0  # tokens preempted sequences computed again
    kv_host: HostTierStats | None = None  # with a host KV tier
    lora: LoRAStats | None = None  # with LoRA on
    grammar_compile_seconds: list[float] = field(default_factory=list)  # compiles finished since the last stats
    spec_decode: SpecDecodeStats | None = None  # with speculative decoding
    kv_transfer: TransferStats | None = None  # with prefill/decode disaggregation
    kv_events_dropped: int = 0  # KV event batches dropped because the publisher's queue was full
    kv_blocks_pinned: int = 0  # free blocks kept ahead in the eviction order (continued conversations)

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total
