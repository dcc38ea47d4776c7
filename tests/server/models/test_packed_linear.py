"""oneDNN-packed linear layers on CPU: the same products as F.linear, bit for bit, so the
engine's greedy tokens do not change when its layers are packed."""

from __future__ import annotations

import pytest
import torch

from argosy import SamplingParams
from argosy.server.models import linear_factory
from argosy.server.models.packed_linear import PackedLinear, packing_supported
from tests.checkpoints import tiny_llm

pytestmark = pytest.mark.skipif(
    not packing_supported(torch.device("cpu"), torch.bfloat16), reason="oneDNN packing is not available"
)


@pytest.mark.parametrize("shape", [(1, 64), (7, 64), (3, 5, 64), (300, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_products_equal_linear_exactly(shape, bias):
    torch.manual_seed(0)
    weight = torch.randn(96, 64).bfloat16()
    b = torch.randn(96).bfloat16() if bias else None
    x = torch.randn(*shape).bfloat16()
    assert torch.equal(PackedLinear.from_weight(weight, b)(x), torch.nn.functional.linear(x, weight, b))


def test_a_packed_engine_gives_the_unpacked_greedy_tokens(llama_checkpoint, monkeypatch):
    prompts = [[5, 6, 7, 8], [200, 3, 9], list(range(3, 40))]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    monkeypatch.setattr(linear_factory, "pairing_supported", lambda device, dtype: False)
    packed = tiny_llm(llama_checkpoint, dtype="bfloat16")
    model = packed.engine.core.executor.worker.runner.model
    assert isinstance(model.lm_head, PackedLinear) and isinstance(model.layers[0].mlp.down_proj, PackedLinear)
    monkeypatch.setattr(linear_factory, "packing_supported", lambda device, dtype: False)
    plain = tiny_llm(llama_checkpoint, dtype="bfloat16")
    assert not any(isinstance(m, PackedLinear) for m in plain.engine.core.executor.worker.runner.model.modules())
    tokens = [
        [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)]
        for llm in (packed, plain)
    ]
    assert tokens[0] == tokens[1]
