"""Sizing the KV cache: bytes per block, and the budget for all of them (a byte count on CPU;
on GPU what `gpu_memory_utilization` leaves once the weights and the largest step fit)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig

CPU_KV_CACHE_BYTES = 2 << 30


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize


def num_kv_blocks(budget: int, block_bytes: int, max_model_len: int, block_size: int, reserved: int = 0) -> int:
    """The blocks a budget holds for sequences once `reserved` blocks are set aside; at least one
    sequence of max_model_len must fit."""
    num_blocks = budget // block_bytes - reserved
    needed = -(-max_model_len // block_size)
    if num_blocks < needed:
        raise InvalidRequestError(
            f"kv_cache_memory of {budget} bytes holds {num_blocks} blocks of {block_size} tokens, fewer than one "
            f"sequence of max_model_len {max_model_len} needs ({needed}); raise kv_cache_memory or lower "
            "max_model_len",
            param="kv_cache_memory",
        )
    return num_blocks


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
