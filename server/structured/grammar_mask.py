"""The device side of structured outputs: each constrained sequence's GrammarState (where its
output stands in its grammar), and GrammarMask, the sampler's edit that leaves each constrained
row only the tokens its grammar allows next. Every step the masks of the constrained rows are
filled on the host in one batched call, after the forward pass was launched (on a GPU they are
filled while it runs), copied to the device without waiting for it, and applied in place."""

from __future__ import annotations

import torch
import xgrammar as xgr


class GrammarState:
    """A sequence's matcher; stop tokens (eos, the request's stop_token_ids) end it only where
    its grammar is complete."""

    def __init__(self, matcher: xgr.GrammarMatcher, stop_words: torch.Tensor):
        self.matcher = matcher
        self.stop_words = stop_words  # the bitmask of the stop tokens, int32 [words]
        self.complete = False  # its grammar is complete and allows nothing more: it ends

    @classmethod
    def start(cls, compiled: xgr.CompiledGrammar, stop_token_ids: list[int], vocab_size: int) -> GrammarState:
        matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids)
        return cls(matcher, _bits(stop_token_ids, vocab_size))

    def fork(self) -> GrammarState:
        return GrammarState(self.matcher.fork(), self.stop_words)

    def accept(self, token_id: int) -> bool:
        """Advances past `token_id`; False when the grammar does not allow it (nothing changes)."""
        if not self.matcher.accept_token(token_id):
            return False
        matcher = self.matcher
        self.complete = matcher.is_terminated() or (matcher.is_completed() and self._only_stops_next())
        return True

    def _only_stops_next(self) -> bool:
        mask = xgr.allocate_token_bitmask(1, len(self.stop_words) * 32)
        self.matcher.fill_next_token_bitmask(mask)
        return not bool((mask[0] & ~self.stop_words).any())


class GrammarMask:
    def __init__(self) -> None:
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)
        self._host: torch.Tensor | None = None  # the bitmask on the host, grown as batches do

    def rows(self, seqs: list) -> list[int]:
        return [i for i, s in enumerate(seqs) if s.grammar is not None]

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list) -> None:
        vocab_size = logits.shape[-1]
        bitmask = self._bitmask(len(seqs), vocab_size, logits.device)
        self.batch.batch_fill_next_token_bitmask([seqs[i].grammar.matcher for i in rows], bitmask, rows)
        on_device = bitmask.to(logits.device, non_blocking=True)
        indices = rows if len(rows) < len(seqs) else None
        xgr.apply_token_bitmask_inplace(logits, on_device, vocab_size=vocab_size, indices=indices)

    def _bitmask(self, batch: int, vocab_size: int, device: torch.device) -> torch.Tensor:
        host = self._host
        if host is None or host.shape[0] < batch:
            host = xgr.allocate_token_bitmask(max(batch, 8), vocab_size)
            self._host = host = host.pin_memory() if device.type == "cuda" else host
        return host[:batch]


def _bits(token_ids: list[int], vocab_size: int) -> torch.Tensor:
    """The bitmask (int32 words, as the library lays them out) with the bits of `token_ids` set."""
    words = [0] * xgr.get_bitmask_shape(1, vocab_size)[1]
    for t in token_ids:
        words[t // 32] |= 1 << (t % 32)
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)
