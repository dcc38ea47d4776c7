"""The device side of structured outputs: each constrained sequence's GrammarState (where its
output stands in its grammar), and GrammarMask, the sampler's edit that leaves each constrained
row only the tokens its grammar allows next. Every step the masks of the constrained rows are
filled on the host in one batched call, after the forward pass was launched (on a GPU they are
filled while it runs), copied to the device without waiting for it, and applied in place."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from argosy.kernels import cpu_kernels

if TYPE_CHECKING:  # imported by the first constrained sequence: an engine serves without it
    import xgrammar as xgr

SURROGATE_LEAD = 0xED  # followed by A0..BF it would encode a surrogate, which is no character


class Vocabulary:
    """What every constrained sequence of one model shares: its tokens' bytes, and bitmasks
    (int32 words, as the library lays them out) of tokens the library's grammars let through
    where strict decoders (Python's, JSON parsers) refuse them: after a lone lead byte 0xED, a
    byte A0..BF (the encoding of a surrogate, which is no character); and in a JSON string, a
    control character (RFC 8259 wants them escaped), by the lexer's state before the token."""

    def __init__(self, token_bytes: list[bytes], vocab_size: int):
        self.token_bytes, self.vocab_size = token_bytes, vocab_size
        self.surrogate_tails = _bits([i for i, b in enumerate(token_bytes) if b and 0xA0 <= b[0] <= 0xBF], vocab_size)
        self.string_controls = {  # (in a string, after a backslash): the tokens that would put one there
            state: _bits([i for i, b in enumerate(token_bytes) if json_lex(b, *state)[2]], vocab_size)
            for state in ((False, False), (True, False), (True, True))
        }

    def stop_words(self, stop_token_ids: list[int]) -> torch.Tensor:
        return _bits(stop_token_ids, self.vocab_size)


class GrammarState:
    """A sequence's matcher; stop tokens (eos, the request's stop_token_ids) end it only where
    its grammar is complete."""

    def __init__(self, matcher: xgr.GrammarMatcher, vocab: Vocabulary, stop_words: torch.Tensor):
        self.matcher, self.vocab = matcher, vocab
        self.stop_words = stop_words  # the bitmask of the stop tokens
        self.complete = False  # its grammar is complete and allows nothing more: it ends
        self.continuations = 0  # UTF-8 continuation bytes the output still owes its last character
        self.after_surrogate_lead = False  # its output ends in a lead byte 0xED, nothing after it
        self.json = False  # its output is JSON: the lexer's state below is followed
        self.in_string = self.escaped = False

    @classmethod
    def start(
        cls, compiled: xgr.CompiledGrammar, stop_token_ids: list[int], vocab: Vocabulary, json: bool
    ) -> GrammarState:
        import xgrammar as xgr

        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)
        state = cls(matcher, vocab, vocab.stop_words(stop_token_ids))
        state.json = json
        return state

    def fork(self) -> GrammarState:
        twin = GrammarState(self.matcher.fork(), self.vocab, self.stop_words)
        for name in ("continuations", "after_surrogate_lead", "json", "in_string", "escaped"):
            setattr(twin, name, getattr(self, name))
        return twin

    def refuse_lenient(self, row: torch.Tensor) -> None:
        """Clears from a filled mask row what the library allows and strict decoders refuse."""
        if self.after_surrogate_lead:
            row &= ~self.vocab.surrogate_tails
        if self.json:
            row &= ~self.vocab.string_controls[self.in_string, self.escaped]

    def accept(self, token_id: int) -> bool:
        """Advances past `token_id`; False when the grammar does not allow it (nothing changes)."""
        if not self.matcher.accept_token(token_id):
            return False
        raw = self.vocab.token_bytes[token_id] if token_id < len(self.vocab.token_bytes) else b""
        self._follow_utf8(raw)
        if self.json:
            self.in_string, self.escaped, _ = json_lex(raw, self.in_string, self.escaped)
        matcher = self.matcher
        self.complete = matcher.is_terminated() or (matcher.is_completed() and self._only_stops_next())
        return True

    def _follow_utf8(self, raw: bytes) -> None:
        for byte in raw:
            if self.continuations:
                self.continuations -= 1
                self.after_surrogate_lead = False
            else:
                self.continuations = 0 if byte < 0xC0 else 1 if byte < 0xE0 else 2 if byte < 0xF0 else 3
                self.after_surrogate_lead = byte == SURROGATE_LEAD

    def _only_stops_next(self) -> bool:
        mask = full_bitmask(1, self.vocab.vocab_size)
        self.matcher.fill_next_token_bitmask(mask)
        return not bool((mask[0] & ~self.stop_words).any())


class GrammarMask:
    def __init__(self) -> None:
        self.batch: xgr.BatchGrammarMatcher | None = None  # made at the first constrained step
        self._host: torch.Tensor | None = None  # the bitmask on the host, grown as batches do

    def rows(self, seqs: list) -> list[int]:
        return [i for i, s in enumerate(seqs) if s.grammar is not None]

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list) -> None:
        import xgrammar as xgr

        if self.batch is None:
            self.batch = xgr.BatchGrammarMatcher(max_threads=1)  # two threads measured no faster
        vocab_size = logits.shape[-1]
        bitmask = self._bitmask(len(seqs), vocab_size, logits.device)
        self.batch.batch_fill_next_token_bitmask([seqs[i].grammar.matcher for i in rows], bitmask, rows)
        for i in rows:
            seqs[i].grammar.refuse_lenient(bitmask[i])
        if logits.device.type == "cpu" and cpu_kernels.cpu_kernels() is not None and logits.stride(1) == 1:
            cpu_kernels.apply_token_bitmask(logits, bitmask, rows)  # 0.1 ms for 64 rows; the library 9
            return
        on_device = bitmask.to(logits.device, non_blocking=True)
        indices = rows if len(rows) < len(seqs) else None
        xgr.apply_token_bitmask_inplace(logits, on_device, vocab_size=vocab_size, indices=indices)

    def _bitmask(self, batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
        host = self._host
        if host is None or host.shape[0] < batch:
            host = full_bitmask(max(batch, 8), vocab_size)
            self._host = host = host.pin_memory() if device.type == "cuda" else host
        return host[:batch]


def json_lex(raw: bytes, in_string: bool, escaped: bool) -> tuple[bool, bool, bool]:
    """JSON's lexer over `raw` from a state: (in a string, after a backslash, whether a control
    character fell inside a string)."""
    control = False
    for byte in raw:
        if not in_string:
            in_string = byte == 0x22  # a quote outside a string opens one
        elif escaped:
            escaped = False
        elif byte == 0x5C:
            escaped = True
        elif byte == 0x22:
            in_string = False
        control = control or (in_string and byte < 0x20)
    return in_string, escaped, control


def bitmask_words(vocab_size: int) -> int:
    """int32 words of a token bitmask, 32 tokens each, as the library lays them out."""
    return -(-vocab_size // 32)


def full_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """Bitmasks allowing every token."""
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32)


def _bits(token_ids: list[int], vocab_size: int) -> torch.Tensor:
    """The bitmask (int32 words, as the library lays them out) with the bits of `token_ids` set."""
    words = [0] * bitmask_words(vocab_size)
    for t in token_ids:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
