"""The C++ elementwise ops against the PyTorch reference in bfloat16: rotary and the residual add
bit for bit; RMSNorm and SiLU-and-multiply nearly all bit for bit, the rest within two bfloat16
steps (float32 sums in another order, another exp: where an intermediate lies on a rounding
boundary, its rounding may flip, and the product carries the step)."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import cpu_elementwise, cpu_kernels, elementwise
from argosy.kernels.attention_backend import select_backend

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def kernels_built():
    assert cpu_kernels.cpu_kernels() is not None, "the kernels must build where the tests run"


def within_two_steps(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    ulp = expected.float().abs().clamp_min(1e-30) * 2**-6  # bfloat16 keeps 8 significant bits
    assert ((actual.float() - expected.float()).abs() <= ulp).all()
    assert (actual == expected).float().mean() > 0.99  # nearly all bit for bit


@pytest.mark.parametrize("rows, width", [(1, 576), (33, 576), (7, 100)])
def test_rms_norm_with_and_without_residual(rows, width):
    torch.manual_seed(rows)
    x, residual = torch.randn(rows, width).to(BF16), torch.randn(rows, width).to(BF16)
    weight = (1 + 0.1 * torch.randn(width)).to(BF16)
    within_two_steps(cpu_elementwise.rms_norm(x, weight, 1e-5), elementwise.rms_norm(x, weight, 1e-5))
    (out, h), (ref_out, ref_h) = (
        cpu_elementwise.rms_norm(x, weight, 1e-5, residual),
        elementwise.rms_norm(x, weight, 1e-5, residual),
    )
    assert torch.equal(h, ref_h)  # the residual add is one rounding, the same
    within_two_steps(out, ref_out)


def test_rotary_on_strided_views_is_bit_for_bit():
    torch.manual_seed(0)
    tokens, heads, kv_heads, dim = 9, 6, 2, 64
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim).to(BF16)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)  # as the model's views
    q, k = q.reshape(tokens, heads, dim), k.reshape(tokens, kv_heads, dim)
    angles = torch.arange(300)[:, None] * 0.37 ** torch.arange(dim // 2)[None, :]
    cos, sin = torch.cat([angles.cos()] * 2, -1).float(), torch.cat([angles.sin()] * 2, -1).float()
    positions = torch.tensor([0, 5, 299, 17, 17, 1, 2, 3, 250])
    got, want = cpu_elementwise.rotary(positions, q, k, cos, sin), elementwise.rotary(positions, q, k, cos, sin)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_silu_and_mul_matches_the_reference():
    torch.manual_seed(1)
    x = (4 * torch.randn(17, 2 * 1536)).to(BF16)
    within_two_steps(cpu_elementwise.silu_and_mul(x), elementwise.silu_and_mul(x))


def test_other_dtypes_take_the_reference():
    x = torch.randn(3, 8)
    weight = torch.rand(8)
    assert torch.equal(cpu_elementwise.rms_norm(x, weight, 1e-6), elementwise.rms_norm(x, weight, 1e-6))
    assert torch.equal(cpu_elementwise.silu_and_mul(x), elementwise.silu_and_mul(x))


def test_the_cpu_backend_uses_them():
    assert select_backend("auto", torch.device("cpu"), 1).kernels is cpu_elementwise.CPU_KERNELS
