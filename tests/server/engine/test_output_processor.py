"""When a sequence ends, and the text it ends with."""

from __future__ import annotations

from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.sampling_params import SamplingParams

EOS = 2


def feed(tokenizer, tokens, max_model_len=64, **params):
    """Appends tokens until the sequence ends: (sequence, tokens taken or None, output text)."""
    processor = OutputProcessor(tokenizer, (EOS,), max_model_len)
    request = Request("r", None, [5, 6], SamplingParams(**params))
    s = Sequence(0, request, 0, [5, 6])
    request.seqs.append(s)
    processor.start(s)
    taken = None
    for i, token in enumerate(tokens):
        if processor.append(s, token, None):
            taken = i + 1
            break
    return s, taken, processor.request_output(request).outputs[0].text


def test_eos_stops_unless_ignored(tokenizer):
    s, at, _ = feed(tokenizer, [40, EOS, 41, 42])
    assert at == 2 and s.finish_reason == "stop" and s.stop_reason is None
    assert s.output_token_ids == [40, EOS]
    s, at, _ = feed(tokenizer, [40, EOS, 41, 42], ignore_eos=True, max_tokens=4)
    assert at == 4 and s.finish_reason == "length"


def test_eos_does_not_stop_before_min_tokens(tokenizer):
    s, at, _ = feed(tokenizer, [EOS, 40, EOS], min_tokens=2)
    assert at == 3 and s.finish_reason == "stop"


def test_max_tokens_and_max_model_len_end_with_length(tokenizer):
    assert feed(tokenizer, [40] * 10, max_tokens=3)[1] == 3
    s, at, _ = feed(tokenizer, [40] * 10, max_model_len=6, max_tokens=None)
    assert at == 4 and s.num_tokens == 6 and s.finish_reason == "length"


def test_a_split_character_at_the_end_is_flushed_when_the_sequence_ends(tokenizer):
    ids = tokenizer.encode("ok 🚀", add_special_tokens=False)[:-1]
    assert tokenizer.decode(ids).endswith("\ufffd")
    s, at, text = feed(tokenizer, ids, max_tokens=len(ids))
    assert at == len(ids) and s.finish_reason == "length"
    assert text == tokenizer.decode(ids)
