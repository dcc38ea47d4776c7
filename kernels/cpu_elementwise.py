"""The decoder's elementwise ops on CPU: the C++ kernels of cpu_elementwise.cpp for bfloat16
rows, the PyTorch reference of elementwise.py for every other dtype or layout (float32 runs,
the per-head q/k norms)."""

from __future__ import annotations

import torch

from argosy.kernels import cpu_kernels, elementwise
from argosy.kernels.elementwise import LayerKernels
from argosy.kernels.lora_ops import lora_runs


def _bf16_rows(t: torch.Tensor) -> bool:
    return t.dtype == torch.bfloat16 and t.dim() == 2 and t.stride(1) == 1


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    fits = _bf16_rows(x) and weight.dtype == torch.bfloat16 and (residual is None or _bf16_rows(residual))
    if not fits:
        return elementwise.rms_norm(x, weight, eps, residual)
    out, h = cpu_kernels.cpu_kernels().rms_norm_bf16(x, weight, eps, residual)
    return out if residual is None else (out, h)


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dtype != torch.bfloat16 or k.dtype != torch.bfloat16 or q.stride(-1) != 1 or k.stride(-1) != 1:
        return elementwise.rotary(positions, q, k, cos, sin)
    return cpu_kernels.cpu_kernels().rotary_bf16(positions.contiguous(), q, k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    if not _bf16_rows(x):
        return elementwise.silu_and_mul(x)
    return cpu_kernels.cpu_kernels().silu_and_mul_bf16(x)


CPU_KERNELS = LayerKernels(rms_norm, rotary, silu_and_mul, lora_runs)
