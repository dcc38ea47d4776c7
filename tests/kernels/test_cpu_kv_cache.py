"""The C++ KV-cache write against the PyTorch reference: the same cache afterwards, from the
model's strided views as from contiguous tensors, and the reference where it cannot apply."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import cpu_kernels, kv_cache_ops

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_write_kv_fills_the_same_slots_as_the_reference(dtype):
    assert cpu_kernels.cpu_kernels() is not None, "the kernels must build where the tests run"
    torch.manual_seed(0)
    tokens, kv_heads, dim, blocks, block_size = 11, 2, 64, 6, 4
    qkv = torch.randn(tokens, (4 + 2 * kv_heads) * dim).to(dtype)
    _, k, v = qkv.split([4 * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    k, v = k.reshape(tokens, kv_heads, dim).contiguous(), v.reshape(tokens, kv_heads, dim)  # v: a strided view
    slots = torch.randperm(blocks * block_size)[:tokens]
    ours = [torch.zeros(blocks, block_size, kv_heads, dim, dtype=dtype) for _ in range(2)]
    reference = [c.clone() for c in ours]
    cpu_kernels.write_kv(k, v, *ours, slots)
    kv_cache_ops.write_kv(k, v, *reference, slots)
    assert torch.equal(ours[0], reference[0]) and torch.equal(ours[1], reference[1])
    assert ours[0].flatten(0, 1)[slots].abs().sum() > 0  # something was written


def test_a_cache_of_another_dtype_takes_the_reference():
    k = v = torch.randn(3, 1, 8)
    caches = [torch.zeros(2, 2, 1, 8, dtype=torch.bfloat16) for _ in range(2)]
    cpu_kernels.write_kv(k, v, *caches, torch.tensor([0, 3, 1]))
    assert torch.equal(caches[0].flatten(0, 1)[[0, 3, 1]], k.to(torch.bfloat16))


def test_a_slot_outside_the_cache_is_refused():
    k = v = torch.randn(1, 1, 8)
    caches = [torch.zeros(2, 2, 1, 8) for _ in range(2)]
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_kernels.write_kv(k, v, *caches, torch.tensor([4]))
