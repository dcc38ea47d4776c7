"""Requests through the offline LLM: seeds, stop conditions, logprobs, per-prompt params, chat."""

from __future__ import annotations

import pytest

from argosy import LLM, SamplingParams
from tests.checkpoints import tiny_llm


@pytest.fixture(scope="module")
def llm(llama_checkpoint) -> LLM:
    return tiny_llm(llama_checkpoint)


def tokens_of(outputs):
    return [o.outputs[0].token_ids for o in outputs]


def test_seeded_request_is_reproducible_whatever_shares_the_batch(llm):
    target = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=24, ignore_eos=True)
    alone = tokens_of(llm.generate("The quick brown fox", target))[0]
    others = ["Paged attention", "Continuous batching lets", "x", "Numbers 0123456789 and symbols"]
    batch = [
        SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=99, max_tokens=5, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        target,
        SamplingParams(temperature=1.2, seed=1234, max_tokens=24, ignore_eos=True),
    ]
    prompts = [*others[:3], "The quick brown fox", *others[3:]]
    mixed = tokens_of(llm.generate(prompts, batch))
    assert mixed[3] == alone
    unseeded = [
        tokens_of(llm.generate("The quick brown fox", SamplingParams(temperature=0.9, max_tokens=24, ignore_eos=True)))[
            0
        ]
        for _ in range(3)
    ]
    assert any(u != alone for u in unseeded)


def test_one_sampling_params_per_prompt(llm):
    outputs = llm.generate(["a", "b", "c"], [SamplingParams(max_tokens=k, ignore_eos=True) for k in (1, 4, 7)])
    assert [len(t) for t in tokens_of(outputs)] == [1, 4, 7]
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)


def test_stop_string_cuts_the_text(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    full = llm.generate("Héllo wörld", greedy)[0].outputs[0].text
    stop = full[10:13]
    assert stop.strip() and full.find(stop) == 10, f"pick another slice of {full!r}"
    cut = llm.generate("Héllo wörld", SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=[stop]))[
        0
    ].outputs[0]
    assert cut.text == full[:10]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    kept = llm.generate(
        "Héllo wörld",
        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, stop=stop, include_stop_str_in_output=True),
    )[0].outputs[0]
    assert kept.text == full[:13]


def test_stop_token_id_ends_the_sequence(llm):
    greedy = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    full = tokens_of(llm.generate("Continuous", greedy))[0]
    stop_id = full[5]
    out = llm.generate(
        "Continuous", SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_id])
    )[0].outputs[0]
    assert out.token_ids == full[: full.index(stop_id) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id


def test_logprobs_are_returned_per_token(llm):
    out = llm.generate("Paged", SamplingParams(temperature=0.0, max_tokens=5, logprobs=3, ignore_eos=True))
    completion = out[0].outputs[0]
    assert len(completion.logprobs) == 5
    for token_id, entry in zip(completion.token_ids, completion.logprobs):
        assert entry[token_id].rank == 1  # greedy: the chosen token is the most likely
        assert len(entry) == 3 and all(lp.logprob <= 0 for lp in entry.values())
        assert all(isinstance(lp.decoded_token, str) for lp in entry.values())
    assert completion.cumulative_logprob == pytest.approx(
        sum(e[t].logprob for t, e in zip(completion.token_ids, completion.logprobs))
    )


def test_chat_uses_the_checkpoint_template(llm):
    tokenizer = llm.get_tokenizer()
    messages = [{"role": "user", "content": "Hi"}]
    rendered = tokenizer.apply_chat_template(messages)
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True))[0]
    assert out.prompt_token_ids == tokenizer.encode(rendered, add_special_tokens=False)
