"""The CPU chunk-attention kernel against plain attention and the tiled PyTorch reference: ragged
chunks after cached prefixes of any length (aligned to blocks or not), shuffled block tables,
GQA ratios, block sizes, float32 and bfloat16, drawn by hypothesis."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.kernels.cpu_kernels import cpu_kernels
from argosy.kernels.paged_attention import build_metadata, paged_attention
from tests.kernels.paged_batch import paged_batch

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]

# (heads, kv_heads, head_dim): SmolLM2's, Llama-3-8B's, no GQA, one KV head, a head size with no
# vector path.
HEADS = [(9, 3, 64), (8, 2, 128), (4, 4, 64), (6, 1, 64), (4, 2, 96)]
TOLERANCE = {torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-5}}
chunk = st.tuples(st.integers(0, 300), st.integers(2, 90))  # (tokens cached before it, its length)


def check(shapes, heads, kv_heads, head_dim, block_size, dtype):
    assert cpu_kernels() is not None, "the kernel must build where the tests run (a C++ compiler is installed)"
    b = paged_batch(shapes, heads, kv_heads, head_dim, block_size, dtype, num_blocks=256)
    args = (b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, block_size)
    kernel_meta, reference_meta = build_metadata(*args, use_cpu_kernels=True), build_metadata(*args)
    assert kernel_meta.chunks is not None and not kernel_meta.tiles
    scale = head_dim**-0.5
    kernel = paged_attention(b.q, b.k_cache, b.v_cache, kernel_meta, scale, b.k, b.v)
    reference = paged_attention(b.q, b.k_cache, b.v_cache, reference_meta, scale, b.k, b.v)
    torch.testing.assert_close(kernel.float(), b.expected, **TOLERANCE[dtype])
    torch.testing.assert_close(kernel, reference, **TOLERANCE[dtype])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(chunk, min_size=1, max_size=4),
    st.sampled_from(HEADS),
    st.sampled_from([16, 16, 5, 32]),
    st.sampled_from([torch.bfloat16, torch.float32]),
    st.integers(0, 2**16),
)
def test_chunks_after_cached_prefixes_match_plain_attention(shapes, heads, block_size, dtype, seed):
    torch.manual_seed(seed)
    check(shapes, *heads, block_size, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_long_prompt_and_verification_sized_chunks(dtype):
    """A whole 700-token prompt (many tiles of rows, keys past a tile's own); chunks of 2 to 9
    tokens (a speculative step's) after a prefix hit that ends mid-block and one that ends on a
    block's edge; decodes beside them."""
    torch.manual_seed(1)
    check([(0, 700), (37, 5), (48, 9), (100, 2), (33, 1), (0, 1)], 9, 3, 64, 16, dtype)


def test_a_chunk_sees_no_key_past_its_own_position():
    """Cache slots past the sequence's keys (never written by a step: here NaN), in its last
    block and in a block its table lists next, change nothing."""
    torch.manual_seed(2)
    b = paged_batch([(20, 10)], 4, 2, 64, 16, torch.bfloat16)
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, 16, use_cpu_kernels=True)
    before = paged_attention(b.q, b.k_cache, b.v_cache, meta, 0.125)
    spare = next(i for i in range(b.k_cache.shape[0]) if i not in b.block_tables[0].tolist())
    tables = torch.cat([b.block_tables, torch.tensor([[spare]])], 1)
    last = b.block_tables[0, 1]
    for cache in (b.k_cache, b.v_cache):
        cache[spare] = float("nan")
        cache[last, 30 - 16 :] = float("nan")  # slots of keys 30 and 31: past the sequence's 30
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, tables, 16, use_cpu_kernels=True)
    after = paged_attention(b.q, b.k_cache, b.v_cache, meta, 0.125)
    assert torch.equal(before, after)
