"""When a sequence ends, and incremental detokenization across split characters."""
from __future__ import annotations

import pytest

from argosy.server.detokenizer import IncrementalDetokenizer
from argosy.server.output_processor import OutputProcessor
from argosy.server.sampling_params import SamplingParams
from argosy.server.sequence import Request, Sequence
from argosy.server.tokenizer import Tokenizer

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(llama_checkpoint) -> Tokenizer:
    return Tokenizer(llama_checkpoint)


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


def test_split_multibyte_characters_decode_incrementally(tokenizer):
    text = "日本語のテキスト 🚀🎉 naïve café"
    ids = tokenizer.encode(text, add_special_tokens=False)
    # The byte-level vocabulary really splits some characters across tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    detok = IncrementalDetokenizer(tokenizer, [5, 6], True, (), False)
    for token in ids:
        detok.add(token)
        assert "\ufffd" not in detok.text
        assert text.startswith(detok.text)
    assert detok.text == text


def test_the_earliest_stop_string_wins_whatever_the_list_order(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [5], True, ("k", "c"), False)
    found = None
    for token in tokenizer.encode(" quick", add_special_tokens=False):
        found = found or detok.add(token)
    assert found == "c" and detok.text == " qui"


def test_a_split_character_at_the_end_is_flushed_when_the_sequence_ends(tokenizer):
    ids = tokenizer.encode("ok 🚀", add_special_tokens=False)[:-1]
    assert tokenizer.decode(ids).endswith("\ufffd")
    s, at, text = feed(tokenizer, ids, max_tokens=len(ids))
    assert at == len(ids) and s.finish_reason == "length"
    assert text == tokenizer.decode(ids)


def test_stop_string_spanning_tokens_is_found_and_held_back_while_running(tokenizer):
    ids = tokenizer.encode("the lazy dog jumps", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [5], True, ("dog",), False)
    found = None
    for token in ids:
        found = detok.add(token)
        if found:
            break
        # Text that could still become "dog" is not shown yet.
        assert not detok.output_text(finished=False).endswith(("d", "do"))
    assert found == "dog" and detok.output_text(finished=True) == "the lazy "
