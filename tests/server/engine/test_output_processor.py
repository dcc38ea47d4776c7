"""When a sequence ends, and the text it ends with: the core's token-level reasons
(stop_conditions) and the API side's text (OutputProcessor), fed one token at a time."""

from __future__ import annotations

import time

from argosy.server.engine.core_protocol import EngineCoreOutput, EngineCoreRequest, TokenLogprobs
from argosy.server.engine.input_processor import NewRequest
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.engine.stop_conditions import finish_reason
from argosy.server.sampling_params import RequestOutputKind, SamplingParams
from tests.checkpoints import tiny_llm

EOS = 2
PROMPT = [5, 6]


def feed(tokenizer, tokens, max_model_len=64, **params):
    """Appends tokens as the core and the API process would, until the request ends:
    (the API's sequence state, tokens taken or None, the stop sequences sent to the core)."""
    sampling = SamplingParams(**params)
    core_seq = Sequence(0, Request("r", PROMPT, sampling), 0, PROMPT)
    processor = OutputProcessor(tokenizer)
    processor.add(NewRequest(EngineCoreRequest("r", PROMPT, sampling, time.monotonic()), None))
    state = processor.requests["r"]
    for i, token in enumerate(tokens):
        core_seq.token_ids.append(token)
        reason, stop_token = finish_reason(core_seq, token, frozenset({EOS}), max_model_len)
        results, stopped = processor.process([EngineCoreOutput("r", 0, [token], None, reason, stop_token)], 0.0)
        if results[0].finished:
            return state.seqs[0], i + 1, stopped, results[0].outputs[0].text
    return state.seqs[0], None, [], None


def test_eos_stops_unless_ignored(tokenizer):
    s, at, _, _ = feed(tokenizer, [40, EOS, 41, 42])
    assert at == 2 and s.finish_reason == "stop" and s.stop_reason is None
    assert s.token_ids == [40, EOS]
    s, at, _, _ = feed(tokenizer, [40, EOS, 41, 42], ignore_eos=True, max_tokens=4)
    assert at == 4 and s.finish_reason == "length"


def test_eos_does_not_stop_before_min_tokens(tokenizer):
    s, at, _, _ = feed(tokenizer, [EOS, 40, EOS], min_tokens=2)
    assert at == 3 and s.finish_reason == "stop"


def test_a_stop_token_is_the_stop_reason(tokenizer):
    s, at, stopped, _ = feed(tokenizer, [40, 41, 42], stop_token_ids=[41])
    assert at == 2 and (s.finish_reason, s.stop_reason) == ("stop", 41) and stopped == []


def test_max_tokens_and_max_model_len_end_with_length(tokenizer):
    assert feed(tokenizer, [40] * 10, max_tokens=3)[1] == 3
    s, at, _, _ = feed(tokenizer, [40] * 10, max_model_len=6, max_tokens=None)
    assert at == 4 and len(PROMPT) + len(s.token_ids) == 6 and s.finish_reason == "length"


def test_a_stop_string_ends_the_text_and_tells_the_core(tokenizer):
    ids = tokenizer.encode(" one two three four", add_special_tokens=False)
    s, at, stopped, text = feed(tokenizer, ids, max_tokens=len(ids), stop=" three")
    assert (s.finish_reason, s.stop_reason) == ("stop", " three") and at < len(ids)
    assert text == " one two" and stopped == [("r", 0)]


def test_a_split_character_at_the_end_is_flushed_when_the_sequence_ends(tokenizer):
    ids = tokenizer.encode("ok 🚀", add_special_tokens=False)[:-1]
    assert tokenizer.decode(ids).endswith("\ufffd")
    s, at, _, text = feed(tokenizer, ids, max_tokens=len(ids))
    assert at == len(ids) and s.finish_reason == "length"
    assert text == tokenizer.decode(ids)


def outputs_of(tokenizer, tokens, kind, **params):
    """Every RequestOutput the processor hands back for one request of two sequences (n=2),
    fed token by token, as `kind` asks for them."""
    sampling = SamplingParams(n=2, max_tokens=len(tokens), logprobs=0, output_kind=kind, **params)
    processor = OutputProcessor(tokenizer)
    processor.add(NewRequest(EngineCoreRequest("r", PROMPT, sampling, time.monotonic()), None))
    results = []
    for i, token in enumerate(tokens):
        last = "length" if i == len(tokens) - 1 else None
        for index in (0, 1):
            lp = TokenLogprobs(token + index, -0.5 * i, 1, [])
            results += processor.process([EngineCoreOutput("r", index, [token + index], [lp], last, None)], 0.0)[0]
    return results


def test_deltas_add_up_to_the_cumulative_output_and_final_only_gives_one(tokenizer):
    ids = tokenizer.encode(" one two 🚀 three four", add_special_tokens=False)
    cumulative = outputs_of(tokenizer, ids, RequestOutputKind.CUMULATIVE, stop=" four")
    deltas = outputs_of(tokenizer, ids, RequestOutputKind.DELTA, stop=" four")
    (final,) = outputs_of(tokenizer, ids, RequestOutputKind.FINAL_ONLY, stop=" four")
    assert len(deltas) == len(cumulative) > 1 and final.finished
    last = cumulative[-1]
    assert final.outputs == last.outputs
    for index in (0, 1):
        pieces = [p for out in deltas for p in out.outputs if p.index == index]
        assert "".join(p.text for p in pieces) == last.outputs[index].text
        assert [t for p in pieces for t in p.token_ids] == last.outputs[index].token_ids
        assert [lp for p in pieces for lp in p.logprobs] == last.outputs[index].logprobs
        assert pieces[-1].finish_reason == last.outputs[index].finish_reason
    # A delta holds only what is new: no output carries more tokens than the steps since the last.
    assert max(len(out.outputs[0].token_ids) for out in deltas) == 1


def test_llm_generate_builds_only_the_final_outputs(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    built = []
    process = llm.engine.outputs.process

    def spy(outputs, now):
        results, stopped = process(outputs, now)
        built.extend(results)
        return results, stopped

    llm.engine.outputs.process = spy
    (out,) = llm.generate("hello", SamplingParams(max_tokens=6, ignore_eos=True))
    assert [r.finished for r in built] == [True] and len(out.outputs[0].token_ids) == 6
