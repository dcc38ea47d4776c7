"""Incremental detokenization: characters split across tokens, and stop strings."""

from __future__ import annotations

from argosy.server.text.detokenizer import IncrementalDetokenizer


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
