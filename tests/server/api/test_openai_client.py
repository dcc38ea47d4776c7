"""The official openai client against a real server on loopback."""

from __future__ import annotations

import pytest

from argosy import LLM, SamplingParams
from tests.processes import MODEL

PROMPT = "The quick brown fox"


def test_models_lists_the_served_model(server):
    models = server.client().models.list().data
    assert [m.id for m in models] == [MODEL]


def test_completion_matches_the_offline_engine(server, llama_checkpoint):
    expected = (
        LLM(str(llama_checkpoint), dtype="float32")
        .generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
        .outputs[0]
    )
    out = server.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
    )
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == "length"
    prompt_tokens = len(server.engine.tokenizer.encode(PROMPT))
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        prompt_tokens,
        12,
        prompt_tokens + 12,
    )


def test_streamed_completion_reassembles_to_the_non_streamed_text(server):
    client = server.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **args))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_and_streamed_chat_agree(server):
    client = server.client()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    args = dict(
        model=MODEL, messages=messages, max_completion_tokens=15, temperature=0, extra_body={"ignore_eos": True}
    )
    whole = client.chat.completions.create(**args)
    assert whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(stream=True, **args))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    tokenizer = server.engine.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(prompt) and whole.usage.completion_tokens == 15


def test_n3_gives_three_choices(server):
    out = server.client().completions.create(
        model=MODEL, prompt=PROMPT, n=3, max_tokens=8, temperature=1.0, seed=5, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert out.usage.completion_tokens == 24
    chat = server.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        n=3,
        max_tokens=4,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    texts = {}
    for chunk in chat:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert sorted(texts) == [0, 1, 2]


def test_stop_string_ends_the_choice(server):
    client = server.client()
    full = (
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    stop = full[8:11]
    assert full.find(stop) == 8
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0, stop=[stop], extra_body={"ignore_eos": True}
    ).choices[0]
    assert out.text == full[:8] and out.finish_reason == "stop"


def test_logprobs_in_both_apis(server):
    client = server.client()
    out = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2, extra_body={"ignore_eos": True}
    ).choices[0]
    assert len(out.logprobs.tokens) == 4 and all(len(top) >= 2 for top in out.logprobs.top_logprobs)
    assert out.logprobs.text_offset[0] == 0 and out.logprobs.text_offset == sorted(out.logprobs.text_offset)
    assert all(t in top for t, top in zip(out.logprobs.tokens, out.logprobs.top_logprobs))
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},
    ).choices[0]
    content = chat.logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 3 for c in content)
    assert all(c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob for c in content)
    assert all(c.logprob == pytest.approx(c.top_logprobs[0].logprob) for c in content)  # greedy
    raw = b"".join(bytes(c.bytes) for c in content)
    assert raw.decode("utf-8", errors="replace") == chat.message.content


def test_streamed_logprob_offsets_continue_across_chunks(server):
    client = server.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=1, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].logprobs
    streamed = [c.choices[0].logprobs for c in client.completions.create(stream=True, **args) if c.choices]
    offsets = [o for lp in streamed if lp for o in lp.text_offset]
    assert offsets == whole.text_offset and offsets == sorted(offsets) and offsets[-1] > 0


def test_echo_prepends_the_prompt(server):
    out = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, echo=True, temperature=0)
    assert out.choices[0].text.startswith(PROMPT)


def test_seed_is_reproducible(server):
    client = server.client()
    args = dict(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=77, extra_body={"ignore_eos": True})
    assert client.completions.create(**args).choices[0].text == client.completions.create(**args).choices[0].text


def test_several_prompts_in_one_completion_call(server):
    out = server.client().completions.create(
        model=MODEL, prompt=["a b", "c d e"], n=2, max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2, 3]
    assert out.usage.completion_tokens == 8
