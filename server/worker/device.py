"""The device and dtype an EngineConfig asks for, settled against the machine and the checkpoint."""

from __future__ import annotations

import typing

import torch

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
        return torch.bfloat16 if torch.ops.mkldnn._is_mkldnn_bf16_supported() else torch.float32
    native = _DTYPES.get(model.torch_dtype or "", torch.bfloat16)
    return torch.bfloat16 if native == torch.float32 else native
