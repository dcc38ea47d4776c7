"""Building blocks of the decoder: RMSNorm, the gated MLP and rotary position embedding. The
elementwise math runs through a `LayerKernels` (PyTorch by default, or the Triton twins), so
the same modules, and their checkpoint parameter names, serve both paths."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from argosy.kernels.elementwise import TORCH_KERNELS, LayerKernels
from argosy.server.models.linear_factory import PLAIN, LinearFactory
from argosy.server.models.model_config import RopeConfig


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, kernels: LayerKernels = TORCH_KERNELS):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.kernels = kernels

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """With `residual`, normalises x + residual and returns it too, as the next residual."""
        return self.kernels.rms_norm(x, self.weight, self.eps, residual)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one matmul; with tensor
    parallelism, a share of the features, whose partial output `all_reduce` sums."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        kernels: LayerKernels = TORCH_KERNELS,
        linears: LinearFactory = PLAIN,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        super().__init__()
        self.gate_up_proj = linears("gate_up_proj", hidden, 2 * intermediate)
        self.down_proj = linears("down_proj", intermediate, hidden)
        self.kernels = kernels
        self.all_reduce = all_reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.down_proj(self.kernels.silu_and_mul(self.gate_up_proj(x)))
        return out if self.all_reduce is None else self.all_reduce(out)


class RotaryEmbedding(nn.Module):
    """Rotary embedding in the half-split layout of Hugging Face checkpoints, with the
    cos/sin tables precomputed in float32 for every position up to `max_position`."""

    def __init__(self, head_dim: int, max_position: int, rope: RopeConfig, kernels: LayerKernels = TORCH_KERNELS):
        super().__init__()
        inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        inv_freq = scale_inv_freq(inv_freq, rope)
        freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        self.kernels = kernels

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotates q [tokens, heads, head_dim] and k [tokens, kv_heads, head_dim] by each
        token's position."""
        return self.kernels.rotary(positions, q, k, self.cos, self.sin)


def scale_inv_freq(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type != "llama3":
        return inv_freq
    # Llama 3 keeps high frequencies, divides low ones by `factor`, and blends in between.
    wavelen = 2 * math.pi / inv_freq
    low_freq_wavelen = rope.original_max_position / rope.low_freq_factor
    high_freq_wavelen = rope.original_max_position / rope.high_freq_factor
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    blended = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)
