"""The Triton attention and KV-cache kernels against their PyTorch references, in Triton's
interpreter on CPU (on a GPU, the same tests run the compiled kernels).

Tolerances: float32 1e-5, as the reference's own test (only the order of accumulation
differs). bfloat16 2e-2: inputs are exact bf16 values and both paths compute in float32, but the
output is rounded to bf16 once, from float32 values that differ in their last bits: one ulp,
2^-8 to 2^-7 relative, up to 0.016 for the outputs of order 2 here."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import kv_cache_ops, triton_kv_cache
from argosy.kernels.paged_attention import build_metadata, paged_attention
from argosy.kernels.triton_attention_decode import MAX_SPLITS, decode_attention, num_splits_for
from argosy.kernels.triton_attention_prefill import prefill_attention
from tests.kernels.paged_batch import paged_batch

# (tokens already cached, new tokens): decodes with ragged contexts, one long enough to split;
# a fresh prompt, a chunk continuing a prompt, a prompt of two query tiles, a prefix-cache hit
# followed by a chunk that is not block-aligned.
SHAPES = [(0, 1), (37, 1), (300, 1), (0, 13), (20, 7), (0, 80), (64, 70), (3, 1)]
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def run_triton(b, heads, head_dim, num_splits):
    out = torch.zeros(b.q.shape[0], heads * head_dim, dtype=b.q.dtype)
    decodes = [i for i, n in enumerate(b.q_lens) if n == 1]
    prefills = [i for i, n in enumerate(b.q_lens) if n > 1]
    scale = head_dim**-0.5
    decode_attention(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens,
        torch.tensor(decodes), b.query_start_loc[decodes], out, scale, num_splits,
    )  # fmt: skip
    prefill_attention(
        b.q, b.k_cache, b.v_cache, b.block_tables, b.seq_lens, b.query_start_loc,
        torch.tensor(prefills), max(b.q_lens), out, scale,
    )  # fmt: skip
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (6, 2), (8, 1)])  # GQA ratios 1, 3, 8
def test_attention_kernels_match_reference(heads, kv_heads, head_dim, block_size, dtype):
    torch.manual_seed(heads * 1000 + head_dim + block_size)
    b = paged_batch(SHAPES, heads, kv_heads, head_dim, block_size, dtype)
    # Four splits: the 300-token context fills three, the fourth is empty and must weigh nothing.
    out = run_triton(b, heads, head_dim, num_splits=4)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.float(), b.expected, atol=tol, rtol=tol)
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, block_size)
    reference = paged_attention(b.q, b.k_cache, b.v_cache, meta, head_dim**-0.5)
    torch.testing.assert_close(out.float(), reference.float(), atol=2 * tol, rtol=2 * tol)


def test_one_split_matches_many():
    torch.manual_seed(1)
    b = paged_batch([(700, 1), (5, 1)], 4, 2, 64, 16, torch.float32)
    one, many = run_triton(b, 4, 64, num_splits=1), run_triton(b, 4, 64, num_splits=8)
    torch.testing.assert_close(one, many, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(many, b.expected, atol=1e-5, rtol=1e-5)


def test_more_splits_than_the_reduction_reads_are_refused():
    b = paged_batch([(40, 1)], 4, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match="num_splits 128 is above 64"):
        run_triton(b, 4, 64, num_splits=128)


def test_splits_fill_the_device_but_never_split_short_contexts():
    assert num_splits_for(num_seqs=1, kv_heads=8, max_seq_len=4096, target_programs=264) == 16
    assert num_splits_for(num_seqs=64, kv_heads=8, max_seq_len=4096, target_programs=264) == 1
    assert num_splits_for(num_seqs=1, kv_heads=8, max_seq_len=300, target_programs=264) == 1
    assert num_splits_for(num_seqs=1, kv_heads=8, max_seq_len=768, target_programs=264) == 2  # not 4 of 192
    assert num_splits_for(num_seqs=1, kv_heads=1, max_seq_len=1 << 20, target_programs=1024) == MAX_SPLITS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_write_kv_matches_reference(dtype):
    torch.manual_seed(2)
    kv_heads, head_dim = 2, 64
    qkv = torch.randn(5, (4 + 2 * kv_heads) * head_dim, dtype=dtype)
    # K and V as the model has them: non-contiguous views into the fused projection.
    _, k, v = qkv.split([4 * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    k, v = k.view(5, kv_heads, head_dim), v.view(5, kv_heads, head_dim)
    slots = torch.tensor([17, 3, 40, 41, 0])
    caches = [torch.zeros(4, 16, kv_heads, head_dim, dtype=dtype) for _ in range(4)]
    kv_cache_ops.write_kv(k, v, caches[0], caches[1], slots)
    triton_kv_cache.write_kv(k, v, caches[2], caches[3], slots)
    assert caches[0].abs().sum() > 0
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_copy_blocks_matches_reference():
    cache = torch.randn(3, 2, 6, 16, 2, 64)
    expected = cache.clone()
    src, dst = torch.tensor([1, 4]), torch.tensor([5, 0])
    kv_cache_ops.copy_blocks(expected, src, dst)
    triton_kv_cache.copy_blocks(cache, src, dst)
    assert torch.equal(cache, expected)
