"""Incremental detokenization: characters split across tokens, stop strings, and the text
always the tokenizer's own decode of the tokens, on both paths (byte-level table, window)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as FastTokenizer
from tokenizers import decoders, models, normalizers, trainers

from argosy.server.text.detokenizer import ByteDetokenizer, WindowDetokenizer, make_detokenizer
from argosy.server.text.tokenizer import Tokenizer

TEXT = "日本語のテキスト 🚀🎉 naïve café"
PATHS = [ByteDetokenizer, WindowDetokenizer]


def detokenizer(cls, tokenizer, stop_strings=(), skip_special_tokens=True, include_stop_str=False):
    if cls is ByteDetokenizer:
        return ByteDetokenizer(tokenizer, skip_special_tokens, stop_strings, include_stop_str)
    return WindowDetokenizer(tokenizer, [5, 6], skip_special_tokens, stop_strings, include_stop_str)


def test_a_byte_level_vocabulary_takes_the_table_path(tokenizer):
    assert tokenizer.decodes_bytes_only
    assert isinstance(make_detokenizer(tokenizer, [5], True, (), False), ByteDetokenizer)


@pytest.mark.parametrize("cls", PATHS)
def test_split_multibyte_characters_decode_incrementally(tokenizer, cls):
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    # The byte-level vocabulary really splits some characters across tokens.
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    detok = detokenizer(cls, tokenizer)
    for token in ids:
        detok.add(token)
        assert "\ufffd" not in detok.text
        assert TEXT.startswith(detok.text)
    assert detok.text == TEXT


@pytest.mark.parametrize("cls", PATHS)
def test_the_earliest_stop_string_wins_whatever_the_list_order(tokenizer, cls):
    detok = detokenizer(cls, tokenizer, ("k", "c"))
    found = None
    for token in tokenizer.encode(" quick", add_special_tokens=False):
        found = found or detok.add(token)
    assert found == "c" and detok.text == " qui"


@pytest.mark.parametrize("cls", PATHS)
def test_stop_string_spanning_tokens_is_found_and_held_back_while_running(tokenizer, cls):
    ids = tokenizer.encode("the lazy dog jumps", add_special_tokens=False)
    detok = detokenizer(cls, tokenizer, ("dog",))
    found = None
    for token in ids:
        found = detok.add(token)
        if found:
            break
        # Text that could still become "dog" is not shown yet.
        assert not detok.output_text(finished=False).endswith(("d", "do"))
    assert found == "dog" and detok.output_text(finished=True) == "the lazy "


@settings(max_examples=200, deadline=None)
@given(data=st.data(), skip=st.booleans(), cls=st.sampled_from(PATHS))
def test_incremental_text_is_the_decode_of_all_tokens(tokenizer, data, skip, cls):
    """Any tokens at all, special ones and stray pieces of characters included: once flushed,
    the text is what decoding them in one go gives."""
    vocab = len(tokenizer.vocab_bytes)
    special = sorted(tokenizer.special_ids)
    ids = data.draw(st.lists(st.integers(0, vocab - 1) | st.sampled_from(special), max_size=40))
    detok = detokenizer(cls, tokenizer, skip_special_tokens=skip)
    for token in ids:
        detok.add(token)
        assert tokenizer.decode(ids, skip).startswith(detok.text)
    detok.flush()
    assert detok.text == tokenizer.decode(ids, skip)


def sentencepiece_style_tokenizer(folder: Path) -> Tokenizer:
    """A Llama-style vocabulary: "▁" for spaces, byte-fallback tokens, a leading space stripped."""
    trained = FastTokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "</s>"])
    trained.train_from_iterator(["the lazy dog jumps over the quick fox"] * 20, trainer)
    model = json.loads(trained.to_str())["model"]
    # The byte tokens belong to the model's vocabulary (not added tokens), as in Llama's.
    vocab = dict(model["vocab"]) | {f"<0x{b:02X}>": len(model["vocab"]) + b for b in range(256)}
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    fast = FastTokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    fast.normalizer = trained.normalizer
    fast.add_special_tokens(["<unk>", "</s>"])
    fast.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    fast.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return Tokenizer(folder)


def test_other_vocabularies_take_the_window_path(tmp_path):
    spm = sentencepiece_style_tokenizer(tmp_path)
    assert not spm.decodes_bytes_only
    ids = spm.encode(" the dog 日本 jumps", add_special_tokens=False)
    assert any(spm.decode([t]) == "\ufffd" for t in ids)  # bytes of characters outside the vocabulary
    prompt = spm.encode("a prompt", add_special_tokens=False)
    detok = make_detokenizer(spm, prompt, True, (), False)
    assert isinstance(detok, WindowDetokenizer)
    for token in ids:
        detok.add(token)
    detok.flush()
    # The text as it continues the prompt: alone, its first space would be stripped.
    assert detok.text == spm.decode(prompt + ids)[len(spm.decode(prompt)) :] == "  the dog 日本 jumps"
