"""The decoder's layers in one C++ call per CPU step (one_call_layers.py): the same bits as the
modules, the hidden states and the KV cache alike, at every instruction-set level, for every
architecture and both kernel formats; the modules wherever a part is outside the kernels; and
the engine uses it unless eager is enforced, with the same greedy tokens."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from argosy import LLM
from argosy.kernels.attention_backend import TorchAttention
from argosy.kernels.cpu_kernels import kernels_built
from argosy.server.models.linear_factory import LinearFactory
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.one_call_layers import one_call_layers
from argosy.server.worker.step_inputs import SequenceChunk, prepare_inputs
from tests.checkpoints import ARCHS
from tests.server.models.test_greedy_identity import mixed_requests, run

pytestmark = [pytest.mark.cpu_kernels, pytest.mark.skipif(not kernels_built(), reason="no CPU kernels")]

CPU = torch.device("cpu")
BLOCK = 16


def load(path, quantization: str | None = None, use_cpu_kernels: bool = True, dtype=torch.bfloat16):
    backend = TorchAttention(use_cpu_kernels=use_cpu_kernels)
    linears = LinearFactory.for_device(quantization, CPU, dtype)
    return load_model(ModelConfig.from_folder(path), dtype, CPU, 512, backend, linears), backend


def steps() -> list[list[SequenceChunk]]:
    """Prompts in chunks beside decodes, then one sequence alone: every token goes through both
    attention kernels (decodes and chunks) and the one-stream path. Sequence i owns blocks 4i.."""
    a, b, c = ([4 * i + j for j in range(4)] for i in range(3))
    return [
        [SequenceChunk(list(range(3, 23)), 0, a, sample=True), SequenceChunk(list(range(40, 47)), 0, b, sample=True)],
        [
            SequenceChunk([7], 20, a, sample=True),
            SequenceChunk([9], 7, b, sample=True),
            SequenceChunk(list(range(60, 90)), 0, c, sample=True),
        ],
        [SequenceChunk([11, 12, 13, 14, 15], 21, a, sample=True, num_draft=4)],
        [SequenceChunk([8], 8, b, sample=True)],
    ]


def hidden_states(model, backend, one_call) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each step's final hidden states, and the KV cache after them all."""
    model.one_call = one_call
    cfg = model.config
    cache = torch.zeros(cfg.num_layers, 2, 12, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16)
    out = []
    with torch.inference_mode():
        for chunks in steps():
            inputs = prepare_inputs(chunks, BLOCK, CPU, backend)
            out.append(model(inputs.input_ids, inputs.positions, cache, inputs.attention))
    return out, cache


@pytest.mark.usefixtures("each_cpu_level")
@pytest.mark.parametrize("quantization", [None, "int8"], ids=["bfloat16", "int8"])
@pytest.mark.parametrize("arch", ARCHS)  # Qwen2's q/k/v biases, Qwen3's per-head q/k norms
def test_one_call_gives_the_modules_bits(checkpoints, arch, quantization):
    model, backend = load(checkpoints[arch], quantization)
    one_call = one_call_layers(model, backend)
    assert one_call is not None
    by_modules, cache_by_modules = hidden_states(model, backend, None)
    in_one_call, cache_in_one_call = hidden_states(model, backend, one_call)
    assert all(torch.equal(a, b) for a, b in zip(by_modules, in_one_call, strict=True))
    assert torch.equal(cache_by_modules, cache_in_one_call) and cache_in_one_call.any()


def test_a_pipeline_stage_after_the_first_starts_from_the_residual_it_was_sent(checkpoints):
    """The layers take (x, residual) as a stage after the first receives them."""
    model, backend = load(checkpoints["llama"])
    one_call = one_call_layers(model, backend)
    torch.manual_seed(0)
    x, residual = torch.randn(2, 7, model.config.hidden_size).bfloat16()
    [chunk] = steps()[0][1:]
    inputs = prepare_inputs([chunk], BLOCK, CPU, backend)
    cfg = model.config
    cache = torch.zeros(cfg.num_layers, 2, 12, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16)
    with torch.inference_mode():
        expected = x, residual
        for layer, layer_cache in zip(model.layers, cache.clone()):
            expected = layer(*expected, inputs.positions, model.rotary, layer_cache, inputs.attention)
        found = one_call(x, residual, inputs.positions, cache, inputs.attention)
    assert torch.equal(found[0], expected[0]) and torch.equal(found[1], expected[1])


class AddsNothing(nn.Module):
    def forward(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out


def test_layers_outside_the_kernels_stay_modules(checkpoints):
    path = checkpoints["llama"]
    float32, backend = load(path, dtype=torch.float32)
    assert one_call_layers(float32, backend) is None  # plain float32 weights: no kernel format
    reference, backend = load(path, use_cpu_kernels=False)
    assert one_call_layers(reference, backend) is None  # the pure-PyTorch backend
    model, backend = load(path)
    model.layers[1].mlp.all_reduce = lambda t: t  # tensor parallelism's sum across ranks
    assert one_call_layers(model, backend) is None
    model, backend = load(path)
    model.layers[0].self_attn.o_proj.add(AddsNothing())  # as a LoRA layer is added
    assert one_call_layers(model, backend) is None


def test_the_engine_runs_one_call_unless_eager_is_enforced_with_the_same_tokens(checkpoints):
    """32 mixed requests through the scheduler (prefix caching, chunked prefills, a small cache)."""
    requests = mixed_requests(32, seed=3)
    tokens = {}
    for eager in (False, True):
        llm = LLM(
            str(checkpoints["llama"]),
            dtype="bfloat16",
            enforce_eager=eager,
            kv_cache_memory=1 << 20,
            max_num_batched_tokens=64,
        )
        assert (llm.engine.core.executor.worker.runner.model.one_call is None) is eager
        tokens[eager] = run(llm, requests)
    assert tokens[False] == tokens[True]
