"""Triton twins of elementwise.py: RMSNorm (optionally fused with the residual add), rotary
embedding and SiLU-and-multiply, with the same signatures. A program takes one token row (or
one head of it; SiLU-and-multiply, a block of its columns); the math is in float32 and each
output is rounded once (the fused norm rounds the new residual first, then normalises that),
where the reference rounds after each op: the two agree to a couple of ulps of the model's
dtype, not bit for bit."""

from __future__ import annotations

import torch

from argosy.kernels import triton_lora
from argosy.kernels.elementwise import LayerKernels
from argosy.kernels.triton_runtime import rounded, tl, triton
from argosy.kernels.triton_variants import launched

SILU_BLOCK = 1024  # columns per program: a wide MLP (I of 14336 and more) spreads over several


def _num_warps(block: int) -> int:
    # About eight elements a thread: a 4096-wide row gets 8 warps, a 128-wide head one.
    return min(max(block // 256, 1), 8)


@launched
@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, residual_out_ptr, eps,
    stride_x_row, stride_x_sub, stride_r_row, stride_r_sub,
    HIDDEN: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    sub = tl.program_id(1).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(x_ptr + row * stride_x_row + sub * stride_x_sub + offs, mask=mask, other=0.0).to(tl.float32)
    out_offs = (row * tl.num_programs(1) + sub) * HIDDEN + offs  # outputs are contiguous
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r_row + sub * stride_r_sub + offs, mask=mask, other=0.0)
        h = rounded(x + r.to(tl.float32), residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + out_offs, h, mask=mask)
        # Normalise the residual as stored, as the reference does: norm and residual agree.
        x = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HIDDEN + eps)
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + out_offs, rounded(x * rstd * w, out_ptr.dtype.element_ty), mask=mask)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, sub, hidden] with a contiguous last dim, a view where strides allow: a 2-D
    row stays a view, and so does a [tokens, heads, head_dim] view of the qkv projection."""
    if x.dim() == 2:
        x = x[:, None, :]
    elif x.dim() != 3:
        x = x.reshape(-1, 1, x.shape[-1])
    return x if x.stride(-1) == 1 else x.contiguous()


def rms_norm_constexprs(hidden: int, has_residual: bool) -> dict:
    block = triton.next_power_of_2(hidden)
    return dict(HIDDEN=hidden, BLOCK=block, HAS_RESIDUAL=has_residual, num_warps=_num_warps(block))


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim. With `residual`, first h = x + residual, and returns
    (rms_norm(h), h). Outputs are new contiguous tensors in the reference's dtypes."""
    hidden = x.shape[-1]
    rows = _rows(x)
    out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if residual is None:
        res_rows, res_out = rows, out  # unread: HAS_RESIDUAL is off
    else:
        res_rows = _rows(residual.expand(x.shape))
        res_out = torch.empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype), device=x.device)
    if x.numel():
        _rms_norm_kernel[(rows.shape[0], rows.shape[1])](
            rows, res_rows, weight.contiguous(), out, res_out, eps,
            rows.stride(0), rows.stride(1), res_rows.stride(0), res_rows.stride(1),
            **rms_norm_constexprs(hidden, residual is not None),
        )  # fmt: skip
    return out if residual is None else (out, res_out)


@triton.jit
def _rotate_heads(
    src_ptr, dst_ptr, token, c1, s1, c2, s2, stride_tok, stride_head,
    HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    offs_h = tl.arange(0, HEADS_PAD)
    offs_d = tl.arange(0, HALF_PAD)
    mask = (offs_h < HEADS)[:, None] & (offs_d < HALF)[None, :]
    src = src_ptr + token * stride_tok + offs_h[:, None] * stride_head + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + (token * HEADS + offs_h[:, None]) * (2 * HALF) + offs_d[None, :]
    ty = dst_ptr.dtype.element_ty
    tl.store(dst, rounded(x1 * c1[None, :] - x2 * s1[None, :], ty), mask=mask)
    tl.store(dst + HALF, rounded(x2 * c2[None, :] + x1 * s2[None, :], ty), mask=mask)


@launched
@triton.jit
def _rotary_kernel(
    positions_ptr, q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, max_position,
    stride_q_tok, stride_q_head, stride_k_tok, stride_k_head, stride_table,
    HEADS: tl.constexpr, HEADS_PAD: tl.constexpr, KV_HEADS: tl.constexpr, KV_HEADS_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, HALF_PAD)
    # A position past the table is never read (the engine never makes one; the reference
    # would raise): memory stays safe without a host-side check that would sync the GPU.
    # Folded into the bound, not `&`-ed as a scalar: the interpreter's bool-tensor & bool-scalar
    # yields integers, which it then refuses as a mask.
    mask = offs_d < tl.where(pos < max_position, HALF, 0)
    table = pos * stride_table + offs_d
    # Both halves of the tables are read rather than assuming cat([freqs, freqs]).
    c1 = tl.load(cos_ptr + table, mask=mask, other=0.0)
    s1 = tl.load(sin_ptr + table, mask=mask, other=0.0)
    c2 = tl.load(cos_ptr + table + HALF, mask=mask, other=0.0)
    s2 = tl.load(sin_ptr + table + HALF, mask=mask, other=0.0)
    _rotate_heads(
        q_ptr, q_out_ptr, token, c1, s1, c2, s2, stride_q_tok, stride_q_head, HEADS, HEADS_PAD, HALF, HALF_PAD
    )
    _rotate_heads(
        k_ptr, k_out_ptr, token, c1, s1, c2, s2, stride_k_tok, stride_k_head, KV_HEADS, KV_HEADS_PAD, HALF, HALF_PAD
    )


def rotary_constexprs(heads: int, kv_heads: int, head_dim: int) -> dict:
    half = head_dim // 2
    return dict(
        HEADS=heads, HEADS_PAD=triton.next_power_of_2(heads),
        KV_HEADS=kv_heads, KV_HEADS_PAD=triton.next_power_of_2(kv_heads),
        HALF=half, HALF_PAD=triton.next_power_of_2(half),
        num_warps=_num_warps(triton.next_power_of_2(heads) * triton.next_power_of_2(half)),
    )  # fmt: skip


def rotary(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [tokens, heads, head_dim], k [tokens, kv_heads, head_dim], each with a contiguous last
    dim and any other strides (views of the qkv projection); cos, sin: float32 tables
    [max_position, head_dim]. Returns new contiguous q and k."""
    num_tokens, heads, head_dim = q.shape
    kv_heads = k.shape[1]
    if head_dim % 2 or k.shape[2] != head_dim:
        raise ValueError(f"rotary needs an even head_dim shared by q and k, got {q.shape} and {k.shape}")
    q, k = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k))
    cos, sin = cos.float().contiguous(), sin.float().contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens:
        _rotary_kernel[(num_tokens,)](
            positions.contiguous(), q, k, cos, sin, q_out, k_out, cos.shape[0],
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            **rotary_constexprs(heads, kv_heads, head_dim),
        )  # fmt: skip
    return q_out, k_out


@launched
@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x_row, INTER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    src = x_ptr + row * stride_x_row + offs
    gate = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(src + INTER, mask=mask, other=0.0).to(tl.float32)
    out = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * INTER + offs, rounded(out, out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_constexprs(inter: int) -> dict:
    block = min(SILU_BLOCK, triton.next_power_of_2(inter))
    return dict(INTER=inter, BLOCK=block, num_warps=_num_warps(block))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2 * I] (gate, then up) -> silu(gate) * up, a new contiguous [..., I]."""
    if x.shape[-1] % 2:
        raise ValueError(f"silu_and_mul needs an even last dim, got {x.shape}")
    inter = x.shape[-1] // 2
    rows = x.reshape(-1, 2 * inter)
    rows = rows if rows.stride(-1) == 1 else rows.contiguous()
    out = torch.empty((*x.shape[:-1], inter), dtype=x.dtype, device=x.device)
    if rows.shape[0] and inter:
        constexprs = silu_and_mul_constexprs(inter)
        _silu_and_mul_kernel[(rows.shape[0], triton.cdiv(inter, constexprs["BLOCK"]))](
            rows, out, rows.stride(0), **constexprs
        )
    return out


TRITON_KERNELS = LayerKernels(rms_norm, rotary, silu_and_mul, triton_lora.lora)
