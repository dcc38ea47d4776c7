"""EngineConfig: every knob of the engine in one place, named as vLLM names them, and
`resolve_limits`, which settles the values that depend on the checkpoint and the device."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from argosy.server.exceptions import InvalidRequestError, UnsupportedModelError
from argosy.server.models.model_config import ModelConfig

DEFAULT_BATCHED_TOKENS = 2048
CPU_KV_CACHE_BYTES = 2 << 30
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class EngineConfig:
    model: str | None = None  # checkpoint folder; None: the embedded default model
    served_model_name: str | None = None
    dtype: str = "auto"  # auto, float32, bfloat16, float16
    device: str = "auto"  # auto, cpu, cuda
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None  # None: 2048, or max_model_len without chunked prefill
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    kv_cache_memory: int | None = None  # bytes; None: 2 GiB on CPU, gpu_memory_utilization on GPU
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        positive = {"block_size": self.block_size, "max_num_seqs": self.max_num_seqs,
                    "max_num_batched_tokens": self.max_num_batched_tokens, "max_model_len": self.max_model_len,
                    "kv_cache_memory": self.kv_cache_memory}
        for name, value in positive.items():
            if value is not None and (not isinstance(value, int) or value < 1):
                raise InvalidRequestError(f"{name} must be a positive integer, got {value!r}", param=name)
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise InvalidRequestError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}",
                                      param="gpu_memory_utilization")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise InvalidRequestError(f"dtype must be auto or one of {', '.join(_DTYPES)}, got {self.dtype!r}",
                                      param="dtype")
        if self.device not in ("auto", "cpu", "cuda"):
            raise InvalidRequestError(f"device must be auto, cpu or cuda, got {self.device!r}", param="device")

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self, model: ModelConfig, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if device.type == "cpu":
            return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
        native = _DTYPES.get(model.torch_dtype or "", torch.bfloat16)
        return torch.bfloat16 if native == torch.float32 else native


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
        batched = DEFAULT_BATCHED_TOKENS if config.enable_chunked_prefill else max(DEFAULT_BATCHED_TOKENS,
                                                                                      max_model_len)
    if not config.enable_chunked_prefill and batched < max_model_len:
        raise InvalidRequestError(
            f"max_num_batched_tokens ({batched}) is smaller than max_model_len ({max_model_len}); without chunked "
            "prefill a whole prompt must fit in one step", param="max_num_batched_tokens")
    return EngineLimits(max_model_len, batched)


def kv_cache_budget(config: EngineConfig, device: torch.device, measure_peak: Callable[[], int]) -> int:
    """Bytes for the KV cache: the configured amount, or what the GPU can spare once the
    weights and the largest step's activations fit. Only that last case runs measure_peak,
    a forward pass of the largest step."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    if device.type != "cuda":
        return CPU_KV_CACHE_BYTES
    peak_bytes = measure_peak()
    free, total = torch.cuda.mem_get_info(device)
    others = max(0, (total - free) - torch.cuda.memory_reserved(device))  # other processes, CUDA context
    return gpu_kv_budget(total, others, peak_bytes, config.gpu_memory_utilization)


def gpu_kv_budget(total: int, others: int, peak_of_ours: int, utilization: float) -> int:
    """Our share of the GPU, minus our peak (weights and the largest step's activations)
    and what others hold."""
    return max(0, int(total * utilization) - peak_of_ours - others)
