"""EngineConfig: every setting of the engine in one place, named as vLLM names them, and
`resolve_limits`, which settles the values that depend on the checkpoint. Nothing here loads
torch, so that the operator can read the server's defaults."""

from __future__ import annotations

import functools
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from argosy.flags import literal_choices, setting
from argosy.server.engine.block_hash import HashAlgo
from argosy.server.exceptions import InvalidRequestError, UnsupportedModelError
from argosy.server.kv_connector.config import KVTransferConfig
from argosy.server.kv_connector.factory import connector_class
from argosy.server.kv_events.config import KVEventsConfig
from argosy.server.models.model_config import ModelConfig
from argosy.server.scheduling.policy import SchedulingPolicy
from argosy.server.spec_decode.config import SpeculativeConfig

DEFAULT_BATCHED_TOKENS = 2048
DType = Literal["auto", "float32", "bfloat16", "float16"]
AttentionBackendName = Literal["auto", "torch", "triton"]
Quantization = Literal["fp8", "int8"]
ExecutorBackend = Literal["uni", "mp"]


@dataclass
class EngineConfig:
    """Every setting of the engine: the keyword arguments of `LLM(...)` and the engine flags of
    `argosy serve` and `argosy generate`, with their defaults and help."""

    model: str | None = setting(
        None, "checkpoint folder (Hugging Face layout); default: the embedded SmolLM2-135M-Instruct"
    )
    tokenizer: str | None = setting(
        None, "tokenizer folder (tokenizer.json, tokenizer_config.json); default: the model's"
    )
    served_model_name: str | None = setting(
        None, "model name reported by the API and in metrics; default: the model path"
    )
    dtype: DType = setting(
        "auto",
        "weights and KV-cache dtype; auto: bfloat16 on CPUs that support it (else float32), the "
        "checkpoint's half type on GPU",
    )
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto: CUDA when present")
    block_size: int = setting(16, "tokens per KV-cache block")
    max_model_len: int | None = setting(
        None, "longest prompt + output, in tokens; default: the checkpoint's max_position_embeddings"
    )
    max_num_seqs: int = setting(256, "most sequences in one step")
    tensor_parallel_size: int = setting(
        1,
        "ranks that split each layer's heads and MLP (q/k/v and gate/up by output, o and down by input, then an "
        "all-reduce; KV heads split, or replicated past their number; embedding and LM head split by vocabulary "
        "rows), a process and a device each within one node (NCCL; on CPU, processes over gloo sharing the "
        "cores); each rank reads only its slices of the checkpoint (and of LoRA adapters; a draft model runs "
        "whole on rank 0); refused, with the numbers, for a size the heads or the MLP cannot be split by or above "
        "the visible GPUs",
    )
    pipeline_parallel_size: int = setting(
        1,
        "stages the decoder layers are split into, contiguous and as even as they divide (the embedding on the "
        "first, the norm and LM head on the last), each stage tensor_parallel_size ranks, the activations passed "
        "between stages (NCCL; on CPU, gloo), one micro-batch a stage in flight (each step 1/P of the sequences); "
        "ranks = tensor x pipeline; refused for more stages than layers or "
        "stages too uneven, and, for now, with LoRA, speculative decoding, a KV connector or the host KV tier",
    )
    nnodes: int = setting(
        1,
        "nodes the ranks span (a model larger than one node): each runs tensor x pipeline / nnodes of them, "
        "numbered stage by stage, so with tensor_parallel_size ranks a node each node holds whole stages; node 0 "
        "serves the API (the leader), the others run `argosy serve --headless`",
    )
    node_rank: int = setting(0, "this node's index, 0 (the leader) to nnodes - 1")
    master_addr: str = setting("127.0.0.1", "the leader's address, where every node's ranks meet (with nnodes above 1)")
    master_port: int = setting(
        29500,
        "the leader's port for torch.distributed's rendezvous; the next port carries the calls to the other nodes",
    )
    distributed_executor_backend: ExecutorBackend | None = setting(
        None,
        "where the workers run: uni, one in the engine's own process; mp, each rank in a process of its own fed "
        "through shared memory; default uni with one rank, mp with tensor parallelism (which needs it)",
    )
    scheduling_policy: SchedulingPolicy = setting(
        "fcfs",
        "which waiting request runs next: fcfs (by arrival); priority (a request's priority, lower first, aged by "
        "64 steps of waiting per level; a request that cannot be admitted preempts running ones behind it that "
        "have run 8 steps; under another policy a non-zero priority is a 400); fair (the user served the fewest "
        "tokens so far, prompt tokens plus twice the output tokens, goes next; a user back from idle starts level "
        "with the least-served active one)",
    )
    max_num_batched_tokens: int | None = setting(
        None,
        f"most tokens in one step; default {DEFAULT_BATCHED_TOKENS}, at least max_model_len without chunked prefill",
    )
    kv_cache_memory: int | None = setting(
        None, "KV cache size in bytes; default 2 GiB on CPU, on GPU what gpu_memory_utilization leaves"
    )
    gpu_memory_utilization: float = setting(0.9, "fraction of GPU memory for weights, activations and KV cache")
    enable_prefix_caching: bool = setting(True, "reuse cached blocks of identical prompt prefixes")
    prefix_caching_hash_algo: HashAlgo = setting(
        "sha256",
        "how full blocks are hashed for the prefix cache and KV events: sha256 (over the parent's digest and the "
        "tokens as 8-byte little-endian integers), or sha256_cbor (vLLM's, which llm-d's precise prefix-cache "
        "scorer computes itself; seeded by $PYTHONHASHSEED, which every replica and the scorer must share)",
    )
    swap_space: float = setting(
        0,
        "GiB of host memory for a second KV tier: blocks the device evicts (a preempted sequence's too) are kept "
        "there and loaded back instead of recomputed; needs prefix caching; not with a draft model; 0: off",
    )
    kv_transfer_config: str | None = setting(
        None,
        'a KV connector, as JSON in vLLM\'s shape: {"kv_connector": NAME, "kv_role": "kv_both", '
        '"kv_connector_extra_config": {...}, "kv_connector_module_path": MODULE} (LLM(kv_transfer_config=) takes '
        "the dict too); built in: ZmqConnector (prefill/decode disaggregation, the default when only kv_role is "
        'given: {"side_channel_host", "side_channel_port": 5600, "hold_timeout": 480, "pull_timeout": 30}) and '
        'HostTierConnector ({"swap_space": GiB}, what --swap-space sets)',
    )
    kv_events_config: str | None = setting(
        None,
        "publish the KV cache's block events for cache-aware routers, as JSON with vLLM's keys: "
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": '
        'null, "buffer_steps": 10000, "hwm": 100000, "max_queue_size": 100000, "topic": ""} (LLM(kv_events_config=) '
        "takes the dict too); multipart [topic, sequence number, msgpack batch] on a ZMQ PUB socket, in vLLM's "
        "encoding",
    )
    enable_chunked_prefill: bool = setting(True, "split long prompts across steps, mixed with decodes")
    async_scheduling: bool = setting(
        False,
        "plan and start each step before the last one's result is taken in, so that the host's work overlaps "
        "the device's (a decode's token, sampled by the step before, is filled in on the device side; with tensor "
        "parallelism decodes wait for theirs); not with speculative decoding",
    )
    seed: int = setting(0, "seed of unseeded sampling")
    attention_backend: AttentionBackendName = setting(
        "auto",
        "kernels of attention, KV-cache writes, norms, rotary and activation; auto: triton on CUDA, torch on CPU "
        "(triton on CPU runs Triton's interpreter: for tests, slow)",
    )
    enforce_eager: bool = setting(
        False, "never run decode steps through CUDA graphs, nor a CPU step's layers in one C++ call"
    )
    cuda_graph_sizes: list[int] = setting(
        [],
        "decode batch sizes to capture as CUDA graphs; default 1, 2, 4, 8, then steps of 8 up to max_num_seqs "
        "(on CPU graphs are used only when sizes are given: the static-buffer twin)",
    )
    quantization: Quantization | None = setting(
        None,
        "fp8: linear-layer weights in float8 e4m3 with per-output-channel scales, quantized at load; FP8 products "
        "on compute capability 8.9 and above, dequantized on the fly elsewhere; int8: weight-only int8 with "
        "per-output-channel scales, every linear layer and the LM head, for CPUs (Argosy's own int8 product, "
        "bfloat16 activations)",
    )
    enable_lora: bool = setting(False, "serve LoRA adapters beside the base model, many in one step")
    max_loras: int = setting(1, "LoRA device slots: the most distinct adapters in one step")
    max_lora_rank: int = setting(16, "the highest LoRA rank served (device slots are this wide)")
    max_cpu_loras: int | None = setting(
        None, "LoRA adapters kept in host memory, least recently used evicted first; default max_loras"
    )
    max_logprobs: int = setting(20, "the most log-probabilities a request may ask for per token")
    structured_outputs_compile_timeout: float = setting(
        10.0, "seconds a request waits for its grammar to compile before it fails (400)"
    )
    structured_outputs_max_whitespace: int = setting(
        16, "most whitespace characters between two JSON tokens of a constrained output"
    )
    speculative_config: str | None = setting(
        None,
        'speculative decoding, as JSON: {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": a, '
        '"prompt_lookup_max": b, "disable_by_batch_size": n}, or {"method": "draft_model", "model": PATH, '
        '"num_speculative_tokens": k} (LLM(speculative_config=) takes the dict too); disable_by_batch_size '
        "(default 16): no speculation while more sequences run",
    )

    @property
    def executor_backend(self) -> ExecutorBackend:
        """distributed_executor_backend, settled: mp with more than one rank."""
        return self.distributed_executor_backend or ("mp" if self.ranks > 1 else "uni")

    @property
    def ranks(self) -> int:
        """Worker processes: tensor_parallel_size in each of pipeline_parallel_size stages."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def ranks_per_node(self) -> int:
        """The ranks each of the nnodes nodes runs (the nodes' first ranks, numbered stage by stage)."""
        return self.ranks // self.nnodes

    @functools.cached_property
    def kv_transfer(self) -> KVTransferConfig | None:
        """The KV connector, parsed: kv_transfer_config's, or the host tier --swap-space asks for."""
        if self.swap_space:
            extra = {"swap_space": self.swap_space}
            return KVTransferConfig("HostTierConnector", "kv_both", extra)
        return KVTransferConfig.parse(self.kv_transfer_config)

    @functools.cached_property
    def kv_events(self) -> KVEventsConfig | None:
        """kv_events_config, parsed."""
        return KVEventsConfig.parse(self.kv_events_config)

    @functools.cached_property
    def speculative(self) -> SpeculativeConfig | None:
        """speculative_config, parsed (the one place it is)."""
        return SpeculativeConfig.parse(self.speculative_config)

    def __post_init__(self) -> None:
        spec = self.speculative  # refused here, naming the field, if bad
        events = self.kv_events
        if events is not None and events.publishes and not self.enable_prefix_caching:
            raise InvalidRequestError(
                "kv_events_config: KV events tell what the prefix cache holds; prefix caching is off",
                param="kv_events_config",
            )
        sizes = self.cuda_graph_sizes
        if any(not isinstance(size, int) or size < 1 for size in sizes) or (sizes and min(sizes) > self.max_num_seqs):
            raise InvalidRequestError(
                f"cuda_graph_sizes must be positive integers, at least one of them at most max_num_seqs "
                f"({self.max_num_seqs}), got {sizes!r}",
                param="cuda_graph_sizes",
            )
        for name in (
            "block_size",
            "max_num_seqs",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "nnodes",
            "max_num_batched_tokens",
            "max_model_len",
            "kv_cache_memory",
            "max_loras",
            "max_lora_rank",
            "max_cpu_loras",
            "structured_outputs_max_whitespace",
            "max_logprobs",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}", param=name)
        if not self.structured_outputs_compile_timeout > 0:
            raise InvalidRequestError(
                f"structured_outputs_compile_timeout must be positive, got {self.structured_outputs_compile_timeout}",
                param="structured_outputs_compile_timeout",
            )
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidRequestError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
                param="gpu_memory_utilization",
            )
        self._check_swap_space(spec)
        if self.async_scheduling and spec is not None:
            raise InvalidRequestError(
                "async_scheduling plans a step before the last one's tokens are known: not with speculative decoding, "
                "whose drafts depend on them",
                param="async_scheduling",
            )
        if self.ranks > 1 and self.distributed_executor_backend == "uni":
            raise InvalidRequestError(
                "tensor_parallel_size or pipeline_parallel_size above 1 runs each rank in a process of its own: "
                "distributed_executor_backend must be mp (or unset)",
                param="distributed_executor_backend",
            )
        self._check_pipeline(spec)
        self._check_nodes()
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidRequestError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})",
                param="max_cpu_loras",
            )
        for name, annotation in typing.get_type_hints(EngineConfig).items():
            choices = literal_choices(annotation)
            optional = type(None) in typing.get_args(annotation)
            value = getattr(self, name)
            if choices is not None and value not in choices and not (optional and value is None):
                raise InvalidRequestError(f"{name} must be one of {', '.join(choices)}, got {value!r}", param=name)

    def _check_nodes(self) -> None:
        if self.ranks % self.nnodes:
            raise InvalidRequestError(
                f"nnodes {self.nnodes} does not divide the {self.ranks} ranks (tensor_parallel_size "
                f"{self.tensor_parallel_size} x pipeline_parallel_size {self.pipeline_parallel_size}) evenly",
                param="nnodes",
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise InvalidRequestError(
                f"node_rank must be from 0 to nnodes - 1 ({self.nnodes - 1}), got {self.node_rank}", param="node_rank"
            )
        if not 0 < self.master_port < 65535:
            raise InvalidRequestError(f"master_port must be a TCP port below 65535, got {self.master_port}",
                                      param="master_port")  # fmt: skip

    def _check_pipeline(self, spec: SpeculativeConfig | None) -> None:
        """What pipeline stages cannot serve yet, refused by name: each holds a part of the layers,
        and these features reach every layer from one place."""
        if self.pipeline_parallel_size == 1:
            return
        unserved = {
            "enable_lora": self.enable_lora,  # the adapters' slots span every layer
            "speculative_config": spec is not None,  # drafts are verified by the whole model in one step
            "kv_transfer_config": self.kv_transfer_config is not None,  # connectors move every layer's blocks
            "swap_space": bool(self.swap_space),
        }
        for name, asked in unserved.items():
            if asked:
                raise InvalidRequestError(
                    f"{name} is not served with pipeline_parallel_size above 1 yet: set one or the other",
                    param=name,
                )

    def _check_swap_space(self, spec: SpeculativeConfig | None) -> None:
        why = None
        if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, int | float) or self.swap_space < 0:
            why = f"swap_space must be a number of GiB, 0 or more, got {self.swap_space!r}"
        if self.swap_space and self.kv_transfer_config is not None:
            raise InvalidRequestError(
                "swap_space and kv_transfer_config both name a KV connector: give one", param="kv_transfer_config"
            )
        connector = self.kv_transfer
        if why is None and connector is not None:
            name = "swap_space" if self.swap_space else "kv_transfer_config"
            # Refused here, naming the field, if bad; a plug-in connector need not say SINGLE_RANK.
            single_rank = getattr(connector_class(connector), "SINGLE_RANK", False)
            if not self.enable_prefix_caching:
                why = f"{name} needs prefix caching: a KV connector finds blocks by the prefix cache's hashes"
            elif spec is not None and spec.method == "draft_model":
                why = f"{name} does not keep a draft model's KV cache: use it with ngram speculation or none"
            elif single_rank and self.tensor_parallel_size > 1:
                why = f"{name}: {connector.kv_connector} moves one rank's blocks: tensor_parallel_size must be 1"
            if why is not None:
                raise InvalidRequestError(why, param=name)
        if why is not None:
            raise InvalidRequestError(why, param="swap_space")


def tokenizer_path(config: EngineConfig, model_path: Path) -> Path:
    return Path(config.tokenizer) if config.tokenizer else model_path


@dataclass(frozen=True)
class EngineLimits:
    max_model_len: int
    max_num_batched_tokens: int


def resolve_limits(config: EngineConfig, model: ModelConfig) -> EngineLimits:
    limit = model.max_position_embeddings
    if model.sliding_window is not None:
        # Without sliding-window attention we serve exactly only contexts inside the window.
        limit = min(limit, model.sliding_window)
    max_model_len = config.max_model_len or limit
    if max_model_len > limit:
        what = "sliding_window" if limit == model.sliding_window else "max_position_embeddings"
        raise UnsupportedModelError(model.path, f"max_model_len {max_model_len} exceeds the model's {what} ({limit})")
    batched = config.max_num_batched_tokens
    if batched is None:
        batched = (
            DEFAULT_BATCHED_TOKENS if config.enable_chunked_prefill else max(DEFAULT_BATCHED_TOKENS, max_model_len)
        )
    if not config.enable_chunked_prefill and batched < max_model_len:
        raise InvalidRequestError(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}); without chunked "
            "prefill a whole prompt must fit in one step",
            param="max_num_batched_tokens",
        )
    return EngineLimits(max_model_len, batched)
