"""The tiled paged-attention reference against plain causal attention computed one
sequence at a time over contiguous keys."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.kv_cache_ops import copy_blocks
from argosy.kernels.paged_attention import build_metadata, paged_attention
from tests.kernels.paged_batch import paged_batch

# (tokens already cached, new tokens): decodes, a fresh prompt, chunks continuing a prompt,
# and a chunk longer than one 64-token tile.
MIXED = [(0, 1), (37, 1), (5, 1), (0, 13), (20, 7), (0, 150), (64, 70), (3, 1)]


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_mixed_batch_matches_per_sequence_attention(block_size, heads, kv_heads, dtype, tol):
    torch.manual_seed(block_size * 10 + heads)
    head_dim = 16
    b = paged_batch(MIXED, heads, kv_heads, head_dim, block_size, dtype)
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, block_size)
    assert [t.q_index.shape[1] for t in meta.tiles] == [1, 64]
    out = paged_attention(b.q, b.k_cache, b.v_cache, meta, head_dim**-0.5)
    torch.testing.assert_close(out.float(), b.expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_fresh_prompts_attended_directly_match_per_sequence_attention(heads, kv_heads, dtype, tol):
    """Prompt chunks with nothing cached before them skip the tiles (and their gather): causal
    attention over their own new keys. Chunks continuing a prompt still take the tiles."""
    torch.manual_seed(heads)
    head_dim = 16
    b = paged_batch(MIXED, heads, kv_heads, head_dim, 4, dtype)
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, 4, direct_prefill=True)
    starts = b.query_start_loc.tolist()
    assert meta.fresh_prefills == [(starts[i], n) for i, (c, n) in enumerate(MIXED) if c == 0 and n > 1]
    assert [t.q_index.shape[1] for t in meta.tiles] == [1, 64]  # (20, 7) and (64, 70) are still tiled
    out = paged_attention(b.q, b.k_cache, b.v_cache, meta, head_dim**-0.5, b.k, b.v)
    torch.testing.assert_close(out.float(), b.expected, atol=tol, rtol=tol)


def test_copy_blocks_copies_every_layer_k_and_v():
    cache = torch.randn(3, 2, 6, 4, 2, 8)
    before = cache.clone()
    copy_blocks(cache, torch.tensor([1, 4]), torch.tensor([5, 0]))
    assert torch.equal(cache[:, :, 5], before[:, :, 1]) and torch.equal(cache[:, :, 0], before[:, :, 4])
    assert torch.equal(cache[:, :, 1:5], before[:, :, 1:5])
