"""Paged prefill/extend attention in Triton over the flattened varlen batch.

A chunk's queries may start mid-sequence (chunked prefill, prefix-cache hits): query row r of a
sequence with q_len new tokens and seq_len cached keys sits at position seq_len - q_len + r and
sees every key up to it. All keys, the chunk's own included, are read from the paged cache
(the chunk's K/V are written first), so a cached prefix and the new tokens are one loop.
One program per (sequence, query head, tile of BLOCK_M query rows); tiles past a sequence's
end run no iterations and store nothing. The block table's row stride (the padded width of an
eager step's tables) is not specialised on, so one compiled variant serves every step."""

from __future__ import annotations

import torch

from argosy.kernels.triton_paged_kv import compute_dtypes, softmax_step, tile_scores
from argosy.kernels.triton_runtime import rounded, tl, triton
from argosy.kernels.triton_variants import launched


@launched
@triton.jit(do_not_specialize=["stride_table"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr, seqs_ptr,
    scale, stride_q_tok, stride_q_head, stride_out_tok, stride_slot, stride_kv_head, stride_table,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    seq = tl.load(seqs_ptr + tl.program_id(0)).to(tl.int64)
    head = tl.program_id(1)
    tile = tl.program_id(2)
    kv_head = head // GROUP
    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    seq_len = tl.load(seq_lens_ptr + seq)
    context = seq_len - q_len

    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    rows = (q_start + offs_m).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_q_tok + head * stride_q_head + offs_d[None, :],
        mask=m_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(COMPUTE)
    q_pos = context + offs_m
    # Keys the tile's last row sees; none for a tile past the sequence's end.
    end = tl.where(tile * BLOCK_M < q_len, tl.minimum(seq_len, context + (tile + 1) * BLOCK_M), 0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    table_ptr = block_tables_ptr + seq * stride_table
    for n0 in range(0, end, BLOCK_N):
        s, v, offs_n = tile_scores(
            q, k_cache_ptr, v_cache_ptr, table_ptr, n0, end, kv_head, stride_slot, stride_kv_head,
            offs_d, d_mask, scale, BLOCK_SIZE, BLOCK_N, COMPUTE, PRECISION,
        )  # fmt: skip
        # Causal: every row sees key 0 on the first tile, so its running maximum is finite.
        s = tl.where(offs_n[None, :] <= q_pos[:, None], s, float("-inf"))
        m, denom, acc = softmax_step(s, v, m, denom, acc, COMPUTE, PRECISION)
    out = acc / tl.where(denom > 0, denom, 1.0)[:, None]
    dst = out_ptr + rows[:, None] * stride_out_tok + head * HEAD_DIM + offs_d[None, :]
    tl.store(dst, rounded(out, out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


# (rows, keys) of a tile, by (head dim padded to 256 or more, float32 cache): at eight warps the
# largest that keep a tile's scores and accumulator in registers (ptxas for sm_90, no spills).
TILES = {(False, False): (64, 64), (True, False): (32, 16), (False, True): (32, 32), (True, True): (16, 16)}


def prefill_constexprs(num_heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> dict:
    """The kernel's compile-time constants and launch options: one set per model and engine."""
    compute, precision = compute_dtypes(dtype)
    d_pad = max(16, triton.next_power_of_2(head_dim))
    wide, exact = d_pad >= 256, dtype == torch.float32
    block_m, block_n = TILES[wide, exact]
    return dict(
        GROUP=num_heads // kv_heads, HEAD_DIM=head_dim, D_PAD=d_pad, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=block_n, COMPUTE=compute, PRECISION=precision, num_warps=8,
        # Float32 K/V tiles, triple-buffered, crowd shared memory; 256-wide ones, registers.
        num_stages=2 if exact or wide else 3,
    )  # fmt: skip


def prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    seqs: torch.Tensor,
    max_q_len: int,
    out: torch.Tensor,
    scale: float,
) -> None:
    """Causal attention of the query rows of each sequence in seqs (query_start_loc[s] to
    query_start_loc[s + 1] of q [tokens, heads, head_dim]) over its paged cache; results go
    to the same rows of out [tokens, heads * head_dim]."""
    if len(seqs) == 0:
        return
    _, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    constexprs = prefill_constexprs(num_heads, kv_heads, head_dim, block_size, k_cache.dtype)
    _prefill_kernel[(len(seqs), num_heads, triton.cdiv(max_q_len, constexprs["BLOCK_M"]))](
        q, k_cache, v_cache, out, block_tables, seq_lens, query_start_loc, seqs,
        scale, q.stride(0), q.stride(1), out.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0), **constexprs,
    )  # fmt: skip
