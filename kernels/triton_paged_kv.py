"""What the Triton attention kernels share: the scores of a tile of keys read through a block
table, one online-softmax step over it, and the dtype their matrix products take."""

from __future__ import annotations

import torch

from argosy.kernels.triton_runtime import INTERPRETED, tl, triton


@triton.jit
def tile_scores(
    q, k_cache_ptr, v_cache_ptr, table_ptr, n0, end, kv_head, stride_slot, stride_kv_head,
    offs_d, d_mask, scale, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Scores of the queries q against the keys at positions n0 .. n0 + BLOCK_N of one sequence
    (table_ptr: its block table), -inf from `end` on, with the tile's values and positions.
    Each key is found by block id, then slot in the block: a tile may span blocks of any size.
    The block size is a compile-time constant (one per engine): a division by a runtime block
    size takes 64-bit division code that spills registers."""
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < end
    block = tl.load(table_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
    slot = block.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE
    offs = slot[:, None] * stride_slot + kv_head * stride_kv_head + offs_d[None, :]
    mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    v = tl.load(v_cache_ptr + offs, mask=mask, other=0.0).to(COMPUTE)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    return tl.where(n_mask[None, :], s, float("-inf")), v, offs_n


@triton.jit
def softmax_step(s, v, m, denom, acc, COMPUTE: tl.constexpr, PRECISION: tl.constexpr):
    """Folds a tile of scores s (masked entries -inf; every row with a finite running maximum
    m) and its values v into the running maximum, denominator and weighted sum."""
    m_new = tl.maximum(m, tl.max(s, 1))
    p = tl.exp(s - m_new[:, None])
    alpha = tl.exp(m - m_new)
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(COMPUTE), v, input_precision=PRECISION)
    return m_new, denom, acc


def compute_dtypes(dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """The dtype matrix products take, and their precision: the cache's own half type on a GPU
    (tensor cores, float32 accumulation); float32 in the interpreter, which cannot do bf16
    arithmetic; float32 caches exactly (no TF32 rounding)."""
    if INTERPRETED or dtype == torch.float32:
        return tl.float32, "ieee"
    return (tl.bfloat16 if dtype == torch.bfloat16 else tl.float16), "tf32"
