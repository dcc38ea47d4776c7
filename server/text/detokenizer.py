"""Incremental detokenization: a sequence's tokens turned into text one token at a time, right
across multi-byte characters split over several tokens, with stop strings found as the text
grows. `ByteDetokenizer` serves byte-level BPE vocabularies (one table lookup per token);
`WindowDetokenizer` serves any other, by decoding a short window of tokens."""

from __future__ import annotations

import codecs

from argosy.server.text.tokenizer import Tokenizer

# Prompt tokens decoded as context before the first output token, so that tokenizers which
# treat the start of a string specially (e.g. dropping a leading space) decode it as it reads.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    """The text so far, and the stop strings it is searched for."""

    def __init__(self, stop_strings: tuple[str, ...], include_stop_str: bool):
        self.text = ""
        self.stop_strings = stop_strings
        self.include_stop_str = include_stop_str
        # While running, hold back text that might turn out to be the start of a stop string.
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1 if not include_stop_str else 0

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Appends a token; returns the stop string it completed, if any (text is then cut)."""
        delta = self._next_text(token_id)
        if not delta:
            return None  # nothing new yet (an incomplete character, or a skipped token)
        self.text += delta
        return self._find_stop(len(delta)) if check_stop and self.stop_strings else None

    def flush(self) -> None:
        """At the end, emits whatever is left, even an incomplete character."""
        self.text += self._rest()

    def output_text(self, finished: bool) -> str:
        if finished or not self.holdback:
            return self.text
        return self.text[: max(0, len(self.text) - self.holdback)]

    def _find_stop(self, new_chars: int) -> str | None:
        """The stop string that occurs first in the text (only new text can complete one)."""
        found = [
            (idx, stop)
            for stop in self.stop_strings
            if (idx := self.text.find(stop, max(0, len(self.text) - new_chars - len(stop) + 1))) >= 0
        ]
        if not found:
            return None
        idx, stop = min(found)
        self.text = self.text[: idx + (len(stop) if self.include_stop_str else 0)]
        return stop

    def _next_text(self, token_id: int) -> str:
        raise NotImplementedError

    def _rest(self) -> str:
        raise NotImplementedError


class ByteDetokenizer(IncrementalDetokenizer):
    """Byte-level BPE: the text is the UTF-8 of the tokens' bytes, so each token's bytes go
    through an incremental UTF-8 decoder, which holds an incomplete character back."""

    def __init__(
        self, tokenizer: Tokenizer, skip_special_tokens: bool, stop_strings: tuple[str, ...], include_stop_str: bool
    ):
        super().__init__(stop_strings, include_stop_str)
        self.vocab_bytes, self.vocab_text = tokenizer.vocab_bytes, tokenizer.vocab_text
        self.skipped = tokenizer.special_ids if skip_special_tokens else frozenset()
        # Invalid bytes become U+FFFD, one per maximal invalid subsequence, as the tokenizer's own decode.
        self.utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self.pending = False  # the decoder holds the first bytes of a character

    def _next_text(self, token_id: int) -> str:
        if token_id in self.skipped or token_id >= len(self.vocab_bytes):
            return ""  # as decode: skipped special tokens and ids outside the vocabulary vanish
        if not self.pending:
            text = self.vocab_text[token_id]
            if text is not None:  # whole characters, the common case: no decoder needed
                return text
        text = self.utf8.decode(self.vocab_bytes[token_id])
        self.pending = bool(self.utf8.getstate()[0])
        return text

    def _rest(self) -> str:
        self.pending = False
        return self.utf8.decode(b"", final=True)


class WindowDetokenizer(IncrementalDetokenizer):
    """Any tokenizer: the new text is what decoding a short window of tokens with the new one
    adds to decoding it without (with context, word-initial spaces come out right)."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], skip_special_tokens: bool, stop_strings, include_stop_str
    ):
        super().__init__(stop_strings, include_stop_str)
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _next_text(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix, full = self._decode_unread()
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""  # an incomplete character: wait for the next token
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def _rest(self) -> str:
        if self.read_offset == len(self.ids):
            return ""
        prefix, full = self._decode_unread()
        self.read_offset = len(self.ids)
        return full[len(prefix) :]

    def _decode_unread(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        return (
            decode(self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens),
            decode(self.ids[self.prefix_offset :], self.skip_special_tokens),
        )


def make_detokenizer(
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    skip_special_tokens: bool,
    stop_strings: tuple[str, ...],
    include_stop_str: bool,
) -> IncrementalDetokenizer:
    if tokenizer.decodes_bytes_only:
        return ByteDetokenizer(tokenizer, skip_special_tokens, stop_strings, include_stop_str)
    return WindowDetokenizer(tokenizer, prompt_ids, skip_special_tokens, stop_strings, include_stop_str)
