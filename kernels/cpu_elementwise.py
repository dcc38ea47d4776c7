"""The decoder's elementwise ops on CPU: the C++ kernels of cpu_elementwise.cpp for bfloat16
rows, the PyTorch reference of elementwise.py for every other dtype or layout (float32 runs,
the per-head q/k norms); and the LoRA products of cpu_lora.cpp, float32 or bfloat16."""

from __future__ import annotations

import torch

from argosy.kernels import cpu_kernels, elementwise
from argosy.kernels.elementwise import LayerKernels
from argosy.kernels.lora_ops import LoRABatch, LoRAStack, lora_runs


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


def lora(x: torch.Tensor, out: torch.Tensor, batch: LoRABatch, stack: LoRAStack) -> None:
    """The C++ kernel: one call per layer, where PyTorch takes 1 + slices products per adapter."""
    same = x.dtype == out.dtype == stack.a.dtype == stack.b.dtype and x.dtype in (torch.float32, torch.bfloat16)
    if not same or x.stride(-1) != 1 or out.stride(-1) != 1:
        return lora_runs(x, out, batch, stack)
    cpu_kernels.cpu_kernels().lora_runs(x, out, stack.a, stack.b, list(stack.bounds), batch.run_table)


CPU_KERNELS = LayerKernels(rms_norm, rotary, silu_and_mul, lora)
