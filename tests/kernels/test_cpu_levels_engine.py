"""The engine at each instruction-set level of the CPU kernels this machine runs (ARGOSY_CPU_ISA
forcing the lower ones): the default model in float32 gives the same greedy tokens at every level,
and the start-up line names the level and the dtype."""

from __future__ import annotations

import pytest

from argosy import LLM, SamplingParams
from argosy.kernels.cpu_isa import ISA_ENV, machine_levels
from argosy.kernels.cpu_kernels import NO_KERNELS, cpu_kernels
from argosy.server.worker.device import cpu_bfloat16_is_faster

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
