"""IncrementalDetokenizer: turns a sequence's tokens into text one token at a time,
right across multi-byte characters split over several tokens, and finds stop strings."""

from __future__ import annotations

from argosy.server.text.tokenizer import Tokenizer

# Prompt tokens decoded as context before the first output token, so that tokenizers which
# treat the start of a string specially (e.g. dropping a leading space) decode it as it reads.
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: list[int],
        skip_special_tokens: bool,
        stop_strings: tuple[str, ...],
        include_stop_str: bool,
    ):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""
        self.stop_strings = stop_strings
        self.include_stop_str = include_stop_str
        # While running, hold back text that might turn out to be the start of a stop string.
        self.holdback = max((len(s) for s in stop_strings), default=1) - 1 if not include_stop_str else 0

    def add(self, token_id: int, check_stop: bool = True) -> str | None:
        """Appends a token; returns the stop string it completed, if any (text is then cut)."""
        self.ids.append(token_id)
        prefix, full = self._decode_unread()
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # an incomplete character: wait for the next token
        delta = full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return self._find_stop(len(delta)) if check_stop else None

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

    def flush(self) -> None:
        """At the end, emits whatever is left, even an incomplete character."""
        if self.read_offset < len(self.ids):
            prefix, full = self._decode_unread()
            self.text += full[len(prefix) :]
            self.read_offset = len(self.ids)

    def _decode_unread(self) -> tuple[str, str]:
        """The context window decoded without and with the tokens not yet read; the new text
        is what the second adds (decoding with context keeps word-initial spaces right)."""
        decode = self.tokenizer.decode
        return (
            decode(self.ids[self.prefix_offset : self.read_offset], self.skip_special_tokens),
            decode(self.ids[self.prefix_offset :], self.skip_special_tokens),
        )

    def copy(self) -> IncrementalDetokenizer:
        twin = object.__new__(IncrementalDetokenizer)
        twin.__dict__.update(self.__dict__)
        twin.ids = list(self.ids)
        return twin
