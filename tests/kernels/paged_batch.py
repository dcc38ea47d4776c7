"""A random step over a paged KV cache, and plain attention to check it against: each
sequence's queries attend causally over its keys, computed one sequence at a time over
contiguous keys, in float32."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from argosy.kernels.kv_cache_ops import write_kv


@dataclass
class PagedBatch:
    q: torch.Tensor  # [tokens, heads, head_dim]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    q_lens: list[int]
    expected: torch.Tensor  # [tokens, heads * head_dim], float32
    k: torch.Tensor  # [tokens, kv_heads, head_dim]: the new tokens' keys (already in the cache)
    v: torch.Tensor


def paged_batch(shapes, heads, kv_heads, head_dim, block_size, dtype, num_blocks=128) -> PagedBatch:
    """shapes: (tokens already cached, new tokens) per sequence. Blocks are handed out shuffled."""
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks).tolist()
    tables, qs, expected, slots, new_k, new_v = [], [], [], [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(table)
        k = torch.randn(total, kv_heads, head_dim, dtype=dtype)
        v = torch.randn(total, kv_heads, head_dim, dtype=dtype)
        seq_slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(total)])
        write_kv(k, v, k_cache, v_cache, seq_slots)
        slots.append(seq_slots[cached:])
        new_k.append(k[cached:])
        new_v.append(v[cached:])
        q = torch.randn(new, heads, head_dim, dtype=dtype)
        qs.append(q)
        expected.append(naive_attention(q, k, v, cached, head_dim**-0.5))
    q_lens = [n for _, n in shapes]
    width = max(map(len, tables))
    return PagedBatch(
        q=torch.cat(qs),
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=torch.cat(slots),
        query_start_loc=torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(q_lens).cumsum(0)]),
        seq_lens=torch.tensor([c + n for c, n in shapes]),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        q_lens=q_lens,
        expected=torch.cat(expected),
        k=torch.cat(new_k),
        v=torch.cat(new_v),
    )


def naive_attention(q, k, v, num_context, scale):
    """q: [new, H, D] at positions num_context.. ; k, v: [num_context + new, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    q_pos = torch.arange(num_context, num_context + q.shape[0])[:, None]
    scores.masked_fill_(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.float()).flatten(1)
