"""The CPU attention kernels against the pure-PyTorch reference (and plain attention): mixed
batches of decodes and prefill chunks, GQA, any block size, float32 and bfloat16; and one
stream's step on the chunk kernel, each of its rows exactly as that position's lone decode."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.attention_backend import select_backend
from argosy.kernels.cpu_kernels import DISABLE_ENV, cpu_kernels
from argosy.kernels.paged_attention import build_metadata, paged_attention
from tests.kernels.paged_batch import paged_batch

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]

SHAPES = [(0, 1), (40, 1), (17, 1), (0, 23), (130, 1), (5, 9), (63, 1), (255, 1)]


@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, block_size, dtype",
    [
        (9, 3, 64, 16, torch.bfloat16),
        (4, 4, 32, 8, torch.float32),
        (8, 2, 128, 16, torch.float32),
        (6, 1, 64, 5, torch.bfloat16),
        (8, 2, 128, 16, torch.bfloat16),
        (4, 2, 96, 7, torch.bfloat16),  # no vector path for this head size: the generic loop
    ],
)
def test_the_cpu_kernels_match_the_reference_on_mixed_batches(heads, kv_heads, head_dim, block_size, dtype):
    assert cpu_kernels() is not None, "the kernel must build where the tests run (a C++ compiler is installed)"
    torch.manual_seed(0)
    b = paged_batch(SHAPES, heads, kv_heads, head_dim, block_size, dtype)
    args = (b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, block_size)
    kernel_meta, reference_meta = build_metadata(*args, use_cpu_kernels=True), build_metadata(*args)
    assert kernel_meta.decodes is not None and kernel_meta.chunks is not None and not kernel_meta.tiles
    scale = head_dim**-0.5
    kernel = paged_attention(b.q, b.k_cache, b.v_cache, kernel_meta, scale)
    reference = paged_attention(b.q, b.k_cache, b.v_cache, reference_meta, scale)
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-5}
    torch.testing.assert_close(kernel.float(), b.expected, **tol)
    torch.testing.assert_close(kernel, reference, **tol)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("shape", [(37, 5), (200, 16), (0, 3), (130, 1)])
def test_one_stream_takes_the_chunk_kernel_whose_rows_are_each_exactly_a_lone_decode(dtype, head_dim, shape):
    """A step of one sequence (a decode, or a speculative step's verification of several
    positions) is attended by the chunk kernel, and each of its rows comes out exactly as that
    position alone, as the one decode of its step: verified tokens get plain decoding's arithmetic."""
    torch.manual_seed(1)
    b = paged_batch([shape], 8, 2, head_dim, 16, dtype)
    meta = build_metadata(b.slot_mapping, b.query_start_loc, b.seq_lens, b.block_tables, 16, use_cpu_kernels=True)
    assert meta.chunks is not None and meta.decodes is None
    scale = head_dim**-0.5
    together = paged_attention(b.q, b.k_cache, b.v_cache, meta, scale)
    torch.testing.assert_close(together.float(), b.expected, atol=2e-2, rtol=2e-2)
    cached, n = shape
    for i in range(n):
        row = slice(i, i + 1)
        alone = build_metadata(b.slot_mapping[row], torch.tensor([0, 1]), torch.tensor([cached + i + 1]),
                               b.block_tables, 16, use_cpu_kernels=True)  # fmt: skip
        assert torch.equal(paged_attention(b.q[row], b.k_cache, b.v_cache, alone, scale), together[row])


def test_argosy_cpu_kernels_0_keeps_decodes_on_the_reference(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "0")
    cpu_kernels.cache_clear()
    try:
        assert cpu_kernels() is None
        assert select_backend("torch", torch.device("cpu"), 1).use_cpu_kernels is False
    finally:
        monkeypatch.delenv(DISABLE_ENV)
        cpu_kernels.cache_clear()
    assert select_backend("auto", torch.device("cpu"), 1).use_cpu_kernels is True
