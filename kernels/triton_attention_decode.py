"""Paged decode attention in Triton, flash-decoding style.

One program per (sequence, KV head, split of the context): the KV head is read once for its
whole group of query heads (GQA), whose queries are the rows of one matrix product. A long
context is split across programs so that a small batch still fills the GPU; each split
leaves a partial output and its log-sum-exp, and a reduction kernel combines them (a single
split writes its output directly). Keys are reached through the block table token by token
(block id, then offset), so any block size works and a tile may span several blocks.

Nothing that changes from step to step is a compile-time constant or a specialised argument:
the number of splits and the block table's row stride are plain runtime values, so one compiled
variant per model serves every batch, and no kernel compiles while requests wait."""

from __future__ import annotations

import torch

from argosy.kernels.triton_paged_kv import compute_dtypes, softmax_step, tile_scores
from argosy.kernels.triton_runtime import rounded, tl, triton
from argosy.kernels.triton_variants import launched

BLOCK_N = 64  # keys per iteration
MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost outweighs the parallelism it adds
MAX_SPLITS = 64  # the reduction's compile-time width; more would not shorten any step much
VARYING = ["stride_table", "num_splits"]  # runtime values Triton must not specialise on


@launched
@triton.jit(do_not_specialize=VARYING)
def _decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, seqs_ptr, tokens_ptr,
    part_out_ptr, part_lse_ptr, out_ptr, scale,
    stride_q_tok, stride_q_head, stride_out_tok, stride_slot, stride_kv_head, stride_table, num_splits,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, COMPUTE: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(seqs_ptr + i).to(tl.int64)
    token = tl.load(tokens_ptr + i).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq)
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, seq_len)

    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, D_PAD)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q = tl.load(
        q_ptr + token * stride_q_tok + heads[:, None] * stride_q_head + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(COMPUTE)
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    denom = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D_PAD], tl.float32)
    table_ptr = block_tables_ptr + seq * stride_table
    for n0 in range(start, end, BLOCK_N):
        s, v, _ = tile_scores(
            q, k_cache_ptr, v_cache_ptr, table_ptr, n0, end, kv_head, stride_slot, stride_kv_head,
            offs_d, d_mask, scale, BLOCK_SIZE, BLOCK_N, COMPUTE, PRECISION,
        )  # fmt: skip
        m, denom, acc = softmax_step(s, v, m, denom, acc, COMPUTE, PRECISION)
    # An empty split (a context shorter than the splits) leaves denom == 0: weight zero below.
    has_keys = denom > 0
    out = acc / tl.where(has_keys, denom, 1.0)[:, None]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if num_splits == 1:  # nothing to combine: the final output, without the reduction kernel
        dst = out_ptr + token * stride_out_tok + heads[:, None] * HEAD_DIM + offs_d[None, :]
        tl.store(dst, rounded(out, out_ptr.dtype.element_ty), mask=out_mask)
    else:
        lse = tl.where(has_keys, m + tl.log(tl.where(has_keys, denom, 1.0)), float("-inf"))
        row = (i * GROUP * tl.num_programs(1) + heads) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=out_mask)
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@launched
@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, tokens_ptr, stride_out_tok, num_splits,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    i = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(tokens_ptr + i).to(tl.int64)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    rows = (i * tl.num_programs(1) + head) * num_splits + offs_s
    lse = tl.load(part_lse_ptr + rows, mask=s_mask, other=float("-inf"))
    weight = tl.exp(lse - tl.max(lse, 0))
    parts = tl.load(
        part_out_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], mask=s_mask[:, None] & d_mask[None, :], other=0.0
    )
    out = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    dst = out_ptr + token * stride_out_tok + head * HEAD_DIM + offs_d
    tl.store(dst, rounded(out, out_ptr.dtype.element_ty), mask=d_mask)


def num_splits_for(num_seqs: int, kv_heads: int, max_seq_len: int, target_programs: int) -> int:
    """Enough splits that the batch fills `target_programs`, never a split under
    MIN_TOKENS_PER_SPLIT tokens of the longest context. A power of two (rounded down), so that
    few variants compile."""
    by_length = max(1, max_seq_len // MIN_TOKENS_PER_SPLIT)
    by_occupancy = -(-target_programs // max(1, num_seqs * kv_heads))
    return 1 << (min(by_length, by_occupancy, MAX_SPLITS).bit_length() - 1)


def split_constexprs(num_heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype) -> dict:
    """The split kernel's compile-time constants: one set per model and engine."""
    group, d_pad = num_heads // kv_heads, max(16, triton.next_power_of_2(head_dim))
    compute, precision = compute_dtypes(dtype)
    return dict(
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        D_PAD=d_pad, BLOCK_SIZE=block_size, COMPUTE=compute, PRECISION=precision,
        # With four warps, or wider tiles of 256-wide heads, a tile's keys, values and scores
        # spill registers (ptxas for sm_90).
        BLOCK_N=BLOCK_N if d_pad < 256 else BLOCK_N // (4 if dtype == torch.float32 else 2), num_warps=8,
    )  # fmt: skip


def reduce_constexprs(head_dim: int) -> dict:
    return dict(HEAD_DIM=head_dim, D_PAD=max(16, triton.next_power_of_2(head_dim)), SPLITS_PAD=MAX_SPLITS)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    seqs: torch.Tensor,
    tokens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    num_splits: int,
) -> None:
    """For each i, the query at token row tokens[i] of q [tokens, heads, head_dim] attends over
    sequence seqs[i]'s cache (block_tables[seqs[i]], seq_lens[seqs[i]] keys); the result goes to
    out[tokens[i]] of out [tokens, heads * head_dim]. Caches: [blocks, block_size, kv_heads, head_dim]."""
    n = len(seqs)
    if n == 0:
        return
    if num_splits > MAX_SPLITS:  # the reduction reads at most MAX_SPLITS parts
        raise ValueError(f"num_splits {num_splits} is above {MAX_SPLITS}")
    _, num_heads, head_dim = q.shape
    _, block_size, kv_heads, _ = k_cache.shape
    parts = n * num_heads * num_splits if num_splits > 1 else 1  # one split writes out directly
    part_out = torch.empty(parts, head_dim, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(parts, dtype=torch.float32, device=q.device)
    _decode_split_kernel[(n, kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, seq_lens, seqs, tokens, part_out, part_lse, out, scale,
        q.stride(0), q.stride(1), out.stride(0), k_cache.stride(1), k_cache.stride(2), block_tables.stride(0),
        num_splits, **split_constexprs(num_heads, kv_heads, head_dim, block_size, k_cache.dtype),
    )  # fmt: skip
    if num_splits == 1:
        return
    _decode_reduce_kernel[(n, num_heads)](
        part_out, part_lse, out, tokens, out.stride(0), num_splits, **reduce_constexprs(head_dim)
    )
