"""The engine at each instruction-set level of the CPU kernels this machine runs (ARGOSY_CPU_ISA
forcing the lower ones): the default model in float32 gives the same greedy tokens at every level,
and the start-up line names the level and the dtype."""

from __future__ import annotations

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.kernels.cpu_isa import ISA_ENV, machine_levels
from argosy.kernels.cpu_kernels import NO_KERNELS, cpu_kernels
from argosy.server.engine_config import EngineConfig
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.device import cpu_bfloat16_is_faster, resolve_dtype

pytestmark = pytest.mark.cpu_kernels  # host tensors, even where CUDA is present

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def test_every_level_gives_the_same_greedy_tokens_in_float32(monkeypatch):
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    tokens = {}
    try:
        for level in machine_levels():
            monkeypatch.setenv(ISA_ENV, level)
            cpu_kernels.cache_clear()
            llm = LLM(dtype="float32", kv_cache_memory=32 << 20, max_model_len=256)
            assert f"engine ready on cpu (kernels {level}), dtype float32: " in llm.engine.core.device.startup
            tokens[level] = [out.outputs[0].token_ids for out in llm.generate(PROMPTS, params)]
            del llm
    finally:
        cpu_kernels.cache_clear()
    assert all(found == tokens["portable"] for found in tokens.values()), tokens


@pytest.mark.parametrize(
    ("kernels", "onednn", "bfloat16"),
    [
        ("avx512_bf16", True, True),
        ("avx2", False, True),
        ("portable", False, False),
        ("portable", True, True),
        (NO_KERNELS, False, False),
        (NO_KERNELS, True, True),
    ],
)
def test_the_default_dtype_is_bfloat16_where_it_was_measured_faster(kernels, onednn, bfloat16):
    """bench/cpu_levels.py: bfloat16 decodes faster with the vector levels' kernels or oneDNN's own
    bfloat16 products, float32 with the portable kernels or none."""
    assert cpu_bfloat16_is_faster(kernels, onednn) is bfloat16


def test_int8_weights_take_bfloat16_activations_by_default_even_where_float32_is_faster(monkeypatch):
    """The int8 product multiplies bfloat16 activations at every level: at the portable one, where
    plain weights default to float32, `--quantization int8` must not fall to its float32 path."""
    monkeypatch.setenv(ISA_ENV, "portable")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)  # a CPU without AVX-512
    cpu_kernels.cache_clear()
    try:
        config = ModelConfig.from_folder(resolve_model_path(None))
        cpu = torch.device("cpu")
        assert resolve_dtype(EngineConfig(quantization="int8"), config, cpu) == torch.bfloat16
        assert resolve_dtype(EngineConfig(), config, cpu) == torch.float32
    finally:
        cpu_kernels.cache_clear()
