"""The engine on the Triton backend (interpreted on CPU) gives the torch backend's greedy
tokens, through chunked prefill, prefix-cache hits and parallel sampling."""

from __future__ import annotations

import pytest

from argosy import LLM, SamplingParams
from tests.checkpoints import tiny_llm


def generate(llm, prompts, **params):
    sampling = SamplingParams(temperature=0.0, ignore_eos=True, **params)
    return [
        [c.token_ids for c in o.outputs] for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sampling)
    ]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_triton_backend_matches_torch_backend(checkpoints, arch):
    shared = list(range(40, 80))  # 40 tokens: two and a half blocks of a common prefix
    prompts = [[*shared, 5, 6, 7], [*shared] + [9] * 30, [11, 12, 13], [*shared, *range(100, 160)]]
    # A 32-token step budget splits the long prompts into chunks that start mid-sequence.
    settings = dict(max_num_batched_tokens=32, enable_prefix_caching=True)
    torch_llm = tiny_llm(checkpoints[arch], attention_backend="torch", **settings)
    triton_llm = tiny_llm(checkpoints[arch], attention_backend="triton", **settings)
    assert triton_llm.engine.core.executor.worker.report.backend == "triton"
    expected = generate(torch_llm, prompts, max_tokens=6)
    assert generate(triton_llm, prompts, max_tokens=6) == expected
    assert triton_llm.engine.core.kv.prefix_cache_hits > 0
    # n > 1: the forks share the prompt's blocks copy-on-write.
    expected = generate(torch_llm, prompts[:2], max_tokens=4, n=2)
    assert generate(triton_llm, prompts[:2], max_tokens=4, n=2) == expected


def test_default_model_in_bfloat16_on_the_triton_backend_answers_paris():
    # bfloat16 through 30 layers: every kernel must round as the GPU does (to nearest), or the
    # residual stream drifts and the answer changes (with truncation it begins "La femme au foyer").
    llm = LLM(attention_backend="triton", dtype="bfloat16", max_model_len=128, max_num_batched_tokens=64)
    # A short system prompt in place of the template's default: fewer interpreted prefill programs.
    question = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    out = llm.chat(question, SamplingParams(temperature=0.0, max_tokens=8))[0].outputs[0]
    assert "Paris" in out.text
