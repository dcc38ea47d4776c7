"""Weight-only int8 (`--quantization int8`): the per-channel quantization, Argosy's int8 product
at every instruction-set level against the sums it defines, and the default model's greedy
tokens against bfloat16's (one row's result alike in any batch: test_paired_linear.py, for both
products)."""

from __future__ import annotations

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.server.models.int8_linear import INT8_MAX, Int8Linear, int8_kernel_fits, quantize_int8

CPU = torch.device("cpu")
kernels = pytest.mark.skipif(not int8_kernel_fits(CPU, torch.bfloat16, 16), reason="no CPU kernels")


def int8_products(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The reference: per output, over the inputs in order, each product added to a float32 sum
    (an int8 times a bfloat16 is exact in float32), then times the channel's scale, plus the bias."""
    xf, qf = x.float(), q.float()
    acc = torch.zeros(x.shape[0], q.shape[0])
    for k in range(q.shape[1]):
        acc = acc + xf[:, k, None] * qf[None, :, k]
    out = acc * scale
    return (out if bias is None else out + bias.float()).bfloat16()


def test_each_channel_is_rounded_to_the_nearest_step_of_its_own_scale():
    torch.manual_seed(0)
    weight = torch.randn(8, 64) * torch.logspace(-3, 2, 8)[:, None]
    weight[3] = 0.0  # a zero row: scale 1, every weight 0, no NaN
    q, scale = quantize_int8(weight)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32
    assert int(q.abs().max()) == INT8_MAX and int(q.min()) >= -INT8_MAX
    assert scale[3] == 1.0 and not q[3].any()
    error = (q.float() * scale[:, None] - weight).abs()
    assert torch.all(error <= scale[:, None] / 2 * (1 + 1e-6))
    # every row but the zero one reaches 127 at its largest magnitude
    assert torch.equal(q.abs().amax(dim=1) == INT8_MAX, torch.arange(8) != 3)


@kernels
@pytest.mark.usefixtures("each_cpu_level")
@pytest.mark.parametrize("rows", [1, 4, 6, 7, 13])
@pytest.mark.parametrize("shape", [(16, 3), (48, 64), (80, 96), (96, 576)])  # 1-5 units, an odd input count
@pytest.mark.parametrize("bias", [False, True])
def test_products_are_the_int8_sums_exactly(rows, shape, bias):
    torch.manual_seed(rows)
    out_features, in_features = shape
    weight = torch.randn(out_features, in_features).bfloat16()
    b = torch.randn(out_features).bfloat16() if bias else None
    x = torch.randn(rows, in_features).bfloat16()
    layer = Int8Linear.from_weight(weight, b)
    assert layer.in_kernel and not hasattr(layer, "weight")  # only the int8 copy is kept
    q, scale = quantize_int8(weight)
    assert torch.equal(layer(x), int8_products(x, q, scale, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outside_the_kernel_the_same_function_runs_in_float32(dtype):
    torch.manual_seed(1)
    weight, bias = torch.randn(40, 24).to(dtype), torch.randn(40).to(dtype)  # 40: not a multiple of 16
    layer = Int8Linear.from_weight(weight, bias)
    assert not layer.in_kernel and layer.int8_weight.dtype == torch.int8
    x = torch.randn(5, 24).to(dtype)
    q, scale = quantize_int8(weight)
    expected = (x.float() @ q.float().T * scale + bias.float()).to(dtype)
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


@kernels
def test_the_default_model_in_int8_agrees_with_bfloat16_on_most_greedy_tokens():
    """The issue's bar, at least 80% of greedy tokens equal, per token: int8's greedy choice after
    each prefix of bfloat16's own greedy answers (a free-running comparison, which counts every
    token after a first difference as different, is lower)."""
    prompts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
        "Water boils at",
        "List three primary colours:",
        "The quick brown fox",
        "In machine learning, a gradient is",
        "Translate to French: good morning",
    ]
    plain = LLM(dtype="bfloat16", kv_cache_memory=32 << 20, max_model_len=256)
    answers = plain.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    del plain
    prefixes = [
        {"prompt_token_ids": [*out.prompt_token_ids, *out.outputs[0].token_ids[:i]]}
        for out in answers
        for i in range(len(out.outputs[0].token_ids))
    ]
    wanted = [token for out in answers for token in out.outputs[0].token_ids]
    int8 = LLM(dtype="bfloat16", quantization="int8", kv_cache_memory=32 << 20, max_model_len=256)
    model = int8.engine.core.executor.worker.runner.model
    assert isinstance(model.lm_head, Int8Linear) and isinstance(model.layers[0].mlp.down_proj, Int8Linear)
    chosen = [
        out.outputs[0].token_ids[0] for out in int8.generate(prefixes, SamplingParams(temperature=0.0, max_tokens=1))
    ]
    agreement = sum(a == b for a, b in zip(chosen, wanted)) / len(wanted)
    assert agreement >= 0.8, agreement
