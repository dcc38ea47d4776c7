"""The tiled paged-attention reference against plain causal attention computed one
sequence at a time over contiguous keys."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.kv_cache_ops import copy_blocks, write_kv
from argosy.kernels.paged_attention import build_metadata, paged_attention


def naive_attention(q, k, v, num_context, scale):
    """q: [new, H, D] at positions num_context.. ; k, v: [num_context + new, Hkv, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    q_pos = torch.arange(num_context, num_context + q.shape[0])[:, None]
    scores.masked_fill_(torch.arange(k.shape[0])[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), v.float()).flatten(1)


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_mixed_batch_matches_per_sequence_attention(block_size, heads, kv_heads, dtype, tol):
    torch.manual_seed(block_size * 10 + heads)
    head_dim, num_blocks = 16, 128
    # (tokens already cached, new tokens): decodes, a fresh prompt, chunks continuing a prompt,
    # and a chunk longer than one 64-token tile.
    shapes = [(0, 1), (37, 1), (5, 1), (0, 13), (20, 7), (0, 150), (64, 70), (3, 1)]
    k_cache = torch.zeros(num_blocks, block_size, kv_heads, head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    free = torch.randperm(num_blocks).tolist()  # scattered, out-of-order blocks
    tables, qs, ks, vs, slots = [], [], [], [], []
    for cached, new in shapes:
        total = cached + new
        table = [free.pop() for _ in range(-(-total // block_size))]
        tables.append(table)
        k = torch.randn(total, kv_heads, head_dim, dtype=dtype)
        v = torch.randn(total, kv_heads, head_dim, dtype=dtype)
        seq_slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in range(total)])
        write_kv(k[:cached], v[:cached], k_cache, v_cache, seq_slots[:cached])
        ks.append(k), vs.append(v), slots.append(seq_slots[cached:])
        qs.append(torch.randn(new, heads, head_dim, dtype=dtype))
    q = torch.cat(qs)
    new_k = torch.cat([k[c:] for k, (c, _) in zip(ks, shapes)])
    new_v = torch.cat([v[c:] for v, (c, _) in zip(vs, shapes)])
    slot_mapping = torch.cat(slots)
    write_kv(new_k, new_v, k_cache, v_cache, slot_mapping)
    q_lens = torch.tensor([n for _, n in shapes])
    query_start_loc = torch.cat([torch.zeros(1, dtype=torch.long), q_lens.cumsum(0)])
    seq_lens = torch.tensor([c + n for c, n in shapes])
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    meta = build_metadata(slot_mapping, query_start_loc, seq_lens, block_tables, block_size)
    assert [t.q_index.shape[1] for t in meta.tiles] == [1, 64]
    out = paged_attention(q, k_cache, v_cache, meta, head_dim**-0.5)
    expected = torch.cat([naive_attention(qi, k, v, c, head_dim**-0.5) for qi, k, v, (c, _) in zip(qs, ks, vs, shapes)])
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


def test_copy_blocks_copies_every_layer_k_and_v():
    cache = torch.randn(3, 2, 6, 4, 2, 8)
    before = cache.clone()
    copy_blocks(cache, torch.tensor([1, 4]), torch.tensor([5, 0]))
    assert torch.equal(cache[:, :, 5], before[:, :, 1]) and torch.equal(cache[:, :, 0], before[:, :, 4])
    assert torch.equal(cache[:, :, 1:5], before[:, :, 1:5])
