"""The decoder's elementwise ops in pure PyTorch: RMSNorm (optionally fused with the residual
add), rotary embedding and SiLU-and-multiply. This is the CPU path and the reference any GPU
kernel must match; it rounds exactly where Hugging Face does, which keeps greedy outputs
identical to transformers'.

`LayerKernels` names one implementation of each op, so the layers can run either this set or
the Triton one without knowing which; the LoRA products of a step (lora_ops.py) are among them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from argosy.kernels.lora_ops import lora_runs


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim. With `residual`, first h = x + residual, and returns
    (rms_norm(h), h): the next layer's residual comes back with its input."""
    if residual is not None:
        h = x + residual
        return rms_norm(h, weight, eps), h
    # Normalise in float32, scale in the model's dtype: as transformers does.
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] by each token's
    position; cos, sin: float32 tables [max_position, head_dim] in the half-split layout."""
    cos = cos[positions][:, None, :]
    sin = sin[positions][:, None, :]
    return _rotate(q, cos.to(q.dtype), sin.to(q.dtype)), _rotate(k, cos.to(k.dtype), sin.to(k.dtype))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2 * I] (gate, then up) -> silu(gate) * up [..., I]."""
    gate, up = x.chunk(2, dim=-1)
    return nn.functional.silu(gate) * up


@dataclass(frozen=True)
class LayerKernels:
    rms_norm: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    rotary: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]
    lora: Callable[..., None]  # (x, out, LoRABatch, LoRAStack): adds the step's adapters' products into out


TORCH_KERNELS = LayerKernels(rms_norm, rotary, silu_and_mul, lora_runs)
