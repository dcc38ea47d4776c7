"""Tokenizer: the ids are the fast tokenizer's own, and the bound a prompt's length gives on its
token count, which lets the server refuse a certainly-too-long prompt without tokenizing it,
never exceeds the real count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from argosy.server.text.tokenizer import Tokenizer
from tests.server.text.test_detokenizer import sentencepiece_style_tokenizer

TEXTS = st.text(st.characters(codec="utf-8"), max_size=200) | st.text("ab  \n日🚀", max_size=400)


@settings(max_examples=200, deadline=None)
@given(text=TEXTS, special=st.booleans())
def test_ids_and_the_length_bound(tokenizer: Tokenizer, text: str, special: bool):
    ids = tokenizer.encode(text, add_special_tokens=special)
    assert ids == tokenizer._tok.encode(text, add_special_tokens=special).ids
    assert tokenizer.fewest_tokens(text) <= len(ids)


def test_the_bound_is_tight_enough_to_refuse_long_prompts(tokenizer: Tokenizer):
    text = "x" * tokenizer.longest_token_bytes * 1000
    assert tokenizer.fewest_tokens(text) == 1000 and len(tokenizer.encode(text)) >= 1000


def test_a_normalizer_makes_nothing_certain(tmp_path):
    spm = sentencepiece_style_tokenizer(tmp_path)  # its normalizer rewrites the text first
    assert spm.fewest_tokens("the dog " * 1000) == 0
