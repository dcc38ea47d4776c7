"""Linear layers from one factory: each weight format computes its product (plain exactly as
F.linear), the factory gives each layer of the model the format the configuration asks for,
and an addition attached to a layer of any format adds its term to every output."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from argosy.kernels.attention_backend import TorchAttention
from argosy.server.models.fp8 import Fp8Linear
from argosy.server.models.linear import Linear
from argosy.server.models.linear_factory import LinearFactory
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.packed_linear import PackedLinear, packing_supported
from argosy.server.models.paired_linear import PairedLinear, pairing_supported

PACKING = packing_supported(torch.device("cpu"), torch.bfloat16)
PAIRING = pairing_supported(torch.device("cpu"), torch.bfloat16)
FORMATS = [
    Linear,
    Fp8Linear,
    pytest.param(PackedLinear, marks=pytest.mark.skipif(not PACKING, reason="no oneDNN")),
    pytest.param(PairedLinear, marks=pytest.mark.skipif(not PAIRING, reason="no AVX512-BF16")),
]


class LowRank(nn.Module):
    """x A^T B^T: the shape of a LoRA adapter's term, added into the layer's output in place."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor):
        super().__init__()
        self.a, self.b = nn.Parameter(a), nn.Parameter(b)

    def term(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.a.t() @ self.b.t()

    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.add_(self.term(x))


def test_a_plain_layer_is_f_linear_and_a_fresh_one_is_initialised_as_nn_linear():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(24, 16), torch.randn(24), torch.randn(5, 16)
    assert torch.equal(Linear.from_weight(weight, bias)(x), nn.functional.linear(x, weight, bias))
    torch.manual_seed(1)
    ours = Linear(16, 24, bias=True)
    torch.manual_seed(1)
    reference = nn.Linear(16, 24, bias=True)
    assert torch.equal(ours.weight, reference.weight) and torch.equal(ours.bias, reference.bias)


@pytest.mark.parametrize("cls", FORMATS)
def test_an_addition_adds_its_term_to_a_layer_of_any_format(cls):
    torch.manual_seed(2)
    weight, bias = torch.randn(32, 48).bfloat16(), torch.randn(32).bfloat16()
    x = torch.randn(3, 48).bfloat16()
    layer = cls.from_weight(weight, bias)
    before = layer(x)
    term = LowRank(torch.randn(4, 48).bfloat16(), torch.randn(32, 4).bfloat16())
    layer.add(term)
    assert torch.equal(layer(x), before + term.term(x))
    assert not torch.equal(layer(x), before)  # the term is not zero: the test could fail


@pytest.mark.parametrize(
    "factory, decoder, head",
    [
        (LinearFactory(), Linear, Linear),
        (LinearFactory(quantization="fp8"), Fp8Linear, Linear),
        pytest.param(
            LinearFactory(packed=True),
            PackedLinear,
            PackedLinear,
            marks=pytest.mark.skipif(not PACKING, reason="no oneDNN"),
        ),
        pytest.param(
            LinearFactory(packed=True, paired=True),
            PairedLinear,
            PairedLinear,
            marks=pytest.mark.skipif(not PAIRING, reason="no AVX512-BF16"),
        ),
    ],
    ids=["plain", "fp8", "packed", "paired"],
)
def test_the_factory_gives_each_layer_its_format(checkpoints, factory, decoder, head):
    model = load_model(ModelConfig.from_folder(checkpoints["llama"]), torch.bfloat16, torch.device("cpu"), 512,
                       TorchAttention(), factory)  # fmt: skip
    layer = model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert type(linear) is decoder
    assert type(model.lm_head) is head


@pytest.mark.parametrize(
    "factory, head, as_plain",
    [
        # oneDNN's packed products are F.linear's, bit for bit: the logits equal the plain model's
        pytest.param(
            LinearFactory(packed=True), PackedLinear, True, marks=pytest.mark.skipif(not PACKING, reason="no oneDNN")
        ),
        # the paired kernel sums in its own fixed order: the logits are its product with the embeddings
        pytest.param(
            LinearFactory(packed=True, paired=True),
            PairedLinear,
            False,
            marks=pytest.mark.skipif(not PAIRING, reason="no AVX512-BF16"),
        ),
    ],
    ids=["packed", "paired"],
)
def test_a_model_with_tied_embeddings_gets_a_head_of_them_in_its_format(tmp_path, factory, head, as_plain):
    from tests.checkpoints import build_checkpoint

    cfg = ModelConfig.from_folder(build_checkpoint(tmp_path / "tied", "qwen2", tie_word_embeddings=True))
    cpu = torch.device("cpu")
    formatted = load_model(cfg, torch.bfloat16, cpu, 512, TorchAttention(), factory)
    plain = load_model(cfg, torch.bfloat16, cpu, 512, TorchAttention())
    assert type(formatted.lm_head) is head and plain.lm_head is None
    hidden = torch.randn(4, cfg.hidden_size).bfloat16()
    expected = plain.compute_logits(hidden) if as_plain else head.from_weight(plain.embed_tokens.weight)(hidden)
    assert torch.equal(formatted.compute_logits(hidden), expected)
