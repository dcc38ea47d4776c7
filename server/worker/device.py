"""The device and dtype an EngineConfig asks for, settled against the machine and the checkpoint."""

from __future__ import annotations

import typing

import torch

from argosy.kernels import cpu_kernels
from argosy.server.engine_config import DType, EngineConfig
from argosy.server.models.model_config import ModelConfig

_DTYPES = {name: getattr(torch, name) for name in typing.get_args(DType) if name != "auto"}


def resolve_device(config: EngineConfig) -> torch.device:
    if config.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(config.device)


def resolve_dtype(config: EngineConfig, model: ModelConfig, device: torch.device) -> torch.dtype:
    if config.dtype != "auto":
        return _DTYPES[config.dtype]
    if device.type == "cpu":
        if config.quantization == "int8" and cpu_kernels.kernels_built():
            return torch.bfloat16  # the int8 product's activations, at every level
        faster = cpu_bfloat16_is_faster(cpu_kernels.level_in_use(), torch.ops.mkldnn._is_mkldnn_bf16_supported())
        return torch.bfloat16 if faster else torch.float32
    native = _DTYPES.get(model.torch_dtype or "", torch.bfloat16)
    return torch.bfloat16 if native == torch.float32 else native


def cpu_bfloat16_is_faster(kernels: str, onednn_bfloat16: bool) -> bool:
    """Measured with bench/cpu_levels.py: bfloat16 weights decode faster wherever Argosy's kernels
    run at a vector level (AVX2 and up: 2.2x float32 at one sequence on AVX2, 1.4x at sixteen) or
    oneDNN multiplies bfloat16 natively; with the portable kernels float32 serves batches 2.4x faster.
    `kernels`: the level in use (cpu_kernels.level_in_use())."""
    return kernels not in ("portable", cpu_kernels.NO_KERNELS) or onednn_bfloat16
