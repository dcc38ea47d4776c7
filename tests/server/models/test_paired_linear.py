"""Linear layers in pairs of inputs for Argosy's own bfloat16 kernel: at every instruction-set
level its sums are exactly the ones AVX512-BF16's pair product defines, in one fixed order per
row, so a row's result never depends on the rows computed beside it; an engine made of them
gives a prompt the same tokens and log-probabilities alone or in any batch."""

from __future__ import annotations

import pytest
import torch

from argosy import SamplingParams
from argosy.server.models.int8_linear import Int8Linear
from argosy.server.models.paired_linear import PairedLinear, pairing_fits, pairing_supported
from tests.checkpoints import build_checkpoint, tiny_llm

pytestmark = [
    pytest.mark.skipif(not pairing_supported(torch.device("cpu"), torch.bfloat16), reason="no CPU kernels"),
    pytest.mark.usefixtures("each_cpu_level"),  # the product of each instruction-set level this CPU runs
]


def pair_products(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The reference: per output, over input pairs in order, the odd product then the even one,
    each added to a float32 sum (a product of two bfloat16 values is exact in float32)."""
    xf, wf = x.float(), weight.float()
    acc = torch.zeros(x.shape[0], weight.shape[0])
    for p in range(weight.shape[1] // 2):
        acc = acc + xf[:, 2 * p + 1, None] * wf[None, :, 2 * p + 1]
        acc = acc + xf[:, 2 * p, None] * wf[None, :, 2 * p]
    return (acc if bias is None else acc + bias.float()).bfloat16()


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 40])
@pytest.mark.parametrize("shape", [(16, 2), (48, 64), (80, 96), (96, 576)])  # 1-4 units and a tail
@pytest.mark.parametrize("bias", [False, True])
def test_products_are_the_pair_sums_exactly(rows, shape, bias):
    torch.manual_seed(rows)
    out_features, in_features = shape
    weight = torch.randn(out_features, in_features).bfloat16()
    b = torch.randn(out_features).bfloat16() if bias else None
    x = torch.randn(rows, in_features).bfloat16()
    layer = PairedLinear.from_weight(weight, b)
    assert not hasattr(layer, "weight")  # only the paired copy is kept
    assert torch.equal(layer(x), pair_products(x, weight, b))


@pytest.mark.parametrize("layer_class", [PairedLinear, Int8Linear])  # both of Argosy's CPU products
def test_each_row_is_the_same_alone_or_among_others_and_leading_dims_are_kept(layer_class):
    torch.manual_seed(0)
    layer = layer_class.from_weight(torch.randn(576, 1536).bfloat16())
    x = torch.randn(3, 7, 1536).bfloat16()
    batched = layer(x)
    assert batched.shape == (3, 7, 576)
    alone = torch.stack([torch.cat([layer(x[i, j : j + 1]) for j in range(7)]) for i in range(3)])
    assert torch.equal(batched, alone)
    assert torch.equal(layer(x.transpose(0, 1)), batched.transpose(0, 1))  # rows not contiguous


@pytest.mark.parametrize("layer_class", [PairedLinear, Int8Linear])
def test_no_rows_give_no_rows(layer_class):
    """A chunked prefill's middle step samples nothing: the LM head gets no rows."""
    layer = layer_class.from_weight(torch.randn(64, 32).bfloat16())
    assert layer(torch.empty(0, 32, dtype=torch.bfloat16)).shape == (0, 64)


def test_shapes_outside_the_layout_are_left_to_other_formats():
    assert pairing_fits(64, 320) and not pairing_fits(64, 328) and not pairing_fits(63, 320)


def test_an_engine_gives_a_prompt_the_same_tokens_and_logprobs_alone_or_batched(tmp_path):
    # A down projection over 1536 inputs: where oneDNN's sums change with the rows in the product
    # (its packed engine fails this test there, on the first prompt's logprobs)
    llm = tiny_llm(build_checkpoint(tmp_path / "llama", "llama", intermediate_size=1536), dtype="bfloat16")
    model = llm.engine.core.executor.worker.runner.model
    assert isinstance(model.lm_head, PairedLinear) and isinstance(model.layers[0].mlp.down_proj, PairedLinear)
    prompts = [{"prompt_token_ids": p} for p in ([5, 6, 7, 8], [200, 3, 9], list(range(3, 40)), [11] * 17)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=2)

    def run(batch):
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(batch, params)]

    assert run(prompts) == [run([p])[0] for p in prompts]
