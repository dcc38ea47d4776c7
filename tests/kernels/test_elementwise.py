"""The Triton elementwise kernels (RMSNorm with and without the fused residual add, rotary,
SiLU-and-multiply) against their PyTorch references, in Triton's interpreter on CPU (on a GPU
the same tests run the compiled kernels).

Tolerances: float32 1e-5: both paths compute in float32 and differ only in the order of a sum
and in how rsqrt, exp and division are rounded, a few float32 ulps. bfloat16 2e-2 (absolute
and relative): inputs are exact bf16 values, but the reference rounds to bf16 after each op
(RMSNorm: the normalised value, then its product with the weight; rotary: cos and sin, both
products and their sum; SiLU, then the product) where the kernel rounds once. That is at most two or three
roundings of up to one bf16 ulp each, 2^-8 to 2^-7 of a value: under 2e-2 for values of order
1, which these are (unit-variance inputs, weights near 1, rotations)."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import elementwise, triton_elementwise
from argosy.server.models.layers import GatedMLP, RMSNorm, RotaryEmbedding
from argosy.server.models.model_config import RopeConfig

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
DTYPES = [torch.float32, torch.bfloat16]
TOKENS = 11  # few programs keep the interpreter fast; odd, so no shape lines up by accident
# Llama 3.1's scaling, with a short original context so that 64 positions of a 128-entry table
# span the high, blended and low frequency bands.
LLAMA3 = RopeConfig(
    theta=500000.0, type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=64
)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [64, 576])  # 576 is not a power of two: a masked block
@pytest.mark.parametrize("with_residual", [False, True])
def test_rms_norm_matches_reference(with_residual, hidden, dtype):
    torch.manual_seed(hidden + with_residual)
    # Rows of different scales, so a norm taken over the wrong row or length shows.
    x = (torch.randn(TOKENS, hidden) * torch.linspace(0.1, 4.0, TOKENS)[:, None]).to(dtype)
    weight = (1 + 0.2 * torch.randn(hidden)).to(dtype)
    residual = torch.randn(TOKENS, hidden).to(dtype) if with_residual else None
    expected = elementwise.rms_norm(x, weight, 1e-6, residual)
    actual = triton_elementwise.rms_norm(x, weight, 1e-6, residual)
    if with_residual:
        assert_close(actual[0], expected[0])
        assert_close(actual[1], expected[1])
    else:
        assert_close(actual, expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_of_a_qkv_view(dtype):
    """Qwen3's q/k norm: one RMSNorm per head of a non-contiguous [tokens, heads, head_dim]."""
    torch.manual_seed(3)
    heads, head_dim = 6, 64
    q = torch.randn(TOKENS, (heads + 4) * head_dim).to(dtype)[:, : heads * head_dim].reshape(-1, heads, head_dim)
    assert not q.is_contiguous()
    weight = (1 + 0.2 * torch.randn(head_dim)).to(dtype)
    assert_close(triton_elementwise.rms_norm(q, weight, 1e-6), elementwise.rms_norm(q, weight, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotary_matches_reference(head_dim, dtype):
    torch.manual_seed(head_dim)
    heads, kv_heads = 6, 2  # GQA
    rotary = RotaryEmbedding(head_dim, 128, LLAMA3)
    qkv = torch.randn(TOKENS, (heads + 2 * kv_heads) * head_dim).to(dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.reshape(-1, heads, head_dim), k.reshape(-1, kv_heads, head_dim)
    assert not q.is_contiguous() and not k.is_contiguous()
    positions = torch.randperm(128)[:TOKENS]  # shuffled, from anywhere in the table
    expected = elementwise.rotary(positions, q, k, rotary.cos, rotary.sin)
    actual = triton_elementwise.rotary(positions, q, k, rotary.cos, rotary.sin)
    for a, e in zip(actual, expected):
        assert a.is_contiguous()
        assert_close(a, e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("intermediate", [64, 96])  # 96: a masked block
def test_silu_and_mul_matches_reference(intermediate, dtype):
    torch.manual_seed(intermediate)
    x = (2 * torch.randn(TOKENS, 2 * intermediate)).to(dtype)
    assert_close(triton_elementwise.silu_and_mul(x), elementwise.silu_and_mul(x))


def test_empty_batch():
    x = torch.empty(0, 64)
    assert triton_elementwise.rms_norm(x, torch.ones(64), 1e-6).shape == (0, 64)
    assert triton_elementwise.silu_and_mul(x).shape == (0, 32)
    q, k = triton_elementwise.rotary(torch.empty(0, dtype=torch.int64), x.view(0, 1, 64), x.view(0, 1, 64), *[x] * 2)
    assert q.shape == k.shape == (0, 1, 64)


def test_layers_run_either_kernel_set():
    """The same modules, fed the Triton set, give what the default PyTorch set gives."""
    torch.manual_seed(5)
    x, residual = torch.randn(TOKENS, 64), torch.randn(TOKENS, 64)
    norm, triton_norm = RMSNorm(64, 1e-5), RMSNorm(64, 1e-5, triton_elementwise.TRITON_KERNELS)
    for a, e in zip(triton_norm(x, residual), norm(x, residual)):
        assert_close(a, e)
    mlp, triton_mlp = GatedMLP(64, 96), GatedMLP(64, 96, triton_elementwise.TRITON_KERNELS)
    triton_mlp.load_state_dict(mlp.state_dict())
    with torch.no_grad():
        assert_close(triton_mlp(x), mlp(x))
