"""Offline, a request that fails alone (in sampling, in the core; in detokenizing, beside it)
fails its `generate` call with EngineFailedError naming the prompt, and leaves nothing behind:
the engine serves the next call as if it had not happened."""

from __future__ import annotations

import pytest

from argosy import LLM, SamplingParams
from argosy.server.exceptions import EngineFailedError
from argosy.server.worker import sampler

PROMPTS = [[5, 6, 7], [8, 9, 10, 11]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(llama_checkpoint) -> LLM:
    return LLM(str(llama_checkpoint), dtype="float32", kv_cache_memory=8 << 20)


def generate(llm: LLM) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    return [o.outputs[0].token_ids for o in outs]


def assert_nothing_left(llm: LLM) -> None:
    engine = llm.engine
    assert not engine.requests and not engine.core.has_unfinished_requests()
    assert engine.stats().kv_blocks_used == 0


def test_a_request_whose_sampling_fails_fails_its_call_and_leaves_nothing_behind(llm, monkeypatch):
    before = generate(llm)
    draw, failing = sampler.draw, llm._next_id + 1  # the second prompt of the next call

    def poisoned(probs, seqs):
        if any(s.request_id == str(failing) for s in seqs):
            raise RuntimeError("injected fault")
        return draw(probs, seqs)

    monkeypatch.setattr(sampler, "draw", poisoned)
    with pytest.raises(EngineFailedError, match="prompt 1 failed: sampling failed: RuntimeError: injected fault"):
        llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SamplingParams(seed=1, max_tokens=6))
    assert_nothing_left(llm)
    assert generate(llm) == before


def test_a_request_whose_detokenizing_fails_fails_its_call_and_the_core_drops_it(llm, monkeypatch):
    before = generate(llm)
    outputs, failing = llm.engine.outputs, str(llm._next_id)  # the first prompt of the next call
    real_append = outputs._append

    def append(state, seq, out):
        if out.request_id == failing and seq.num_tokens == 2:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real_append(state, seq, out)

    monkeypatch.setattr(outputs, "_append", append)
    with pytest.raises(EngineFailedError, match="prompt 0 failed: detokenizing its output failed: UnicodeDecodeError"):
        generate(llm)
    assert_nothing_left(llm)
    monkeypatch.undo()
    assert generate(llm) == before
