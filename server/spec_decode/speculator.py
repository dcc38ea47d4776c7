"""Speculator: the engine side of speculative decoding. At each step it proposes drafts for the
running decodes, within what the sequence may still emit, and records what verification kept.
Prompt lookup (ngram) proposes here, from each sequence's own tokens; a draft model proposes on
the device side, after each step's sampling, and its drafts wait here for the next step.

It speculates only where speculation pays. A step of a few sequences reads every weight once
whatever its token count, so verifying k drafts costs little more than one decode; once the
batch is large, the step is bound by arithmetic, and drafts only add to it: with more than
`disable_by_batch_size` sequences running, no sequence speculates. Per sequence, an
exponential average of the fraction of its drafts kept falls when its drafts miss; below
MIN_ACCEPTANCE it stops proposing for PAUSE_TOKENS tokens, then tries again."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from argosy.server.engine.sequence import Sequence
from argosy.server.spec_decode.config import SpeculativeConfig
from argosy.server.spec_decode.speculative_state import SpeculativeState

MIN_ACCEPTANCE = 0.2  # below this average fraction of drafts kept, a sequence pauses
ACCEPTANCE_WEIGHT = 0.3  # of the latest step in the average
PAUSE_TOKENS = 32  # tokens a paused sequence emits before it proposes again


@dataclass
class SpecDecodeStats:
    """Cumulative counts, as vLLM's vllm:spec_decode_* counters report them."""

    num_drafts: int = 0  # verifications of a non-empty draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)  # drafts kept at each position


class Speculator:
    def __init__(self, config: SpeculativeConfig, max_model_len: int):
        self.config, self.max_model_len = config, max_model_len
        self.stats = SpecDecodeStats(accepted_per_pos=[0] * config.num_speculative_tokens)

    def lookahead(self, seq: Sequence, num_new_tokens: int) -> int:
        """Slots past a step's `num_new_tokens` of `seq` that the device side writes after it (the
        draft model's proposals), within the model's length."""
        if self.config.method != "draft_model":
            return 0
        room = self.max_model_len - seq.num_computed_tokens - num_new_tokens
        return max(0, min(self.config.num_speculative_tokens, room))

    def active(self, num_running: int) -> bool:
        return num_running <= self.config.disable_by_batch_size

    def propose(self, seq: Sequence, budget: int) -> list[int]:
        """Drafts for a decode of `seq` (at most `budget` of them): none that would run past
        the sequence's max_tokens or the model's length, and none while it is paused."""
        state = self._state(seq)
        if seq.num_tokens < state.paused_until:
            return []
        max_tokens = seq.params.max_tokens
        room = self.max_model_len - seq.num_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - seq.num_output_tokens - 1)  # the step emits one more than it keeps
        k = min(self.config.num_speculative_tokens, budget, room)
        if k <= 0:
            return []
        index = state.index
        if index is None:
            return state.proposed[:k]
        index.extend(seq.token_ids[len(index.tokens) :])
        return index.propose(k)

    def to_propose(self, seq: Sequence, num_running: int) -> int:
        """How many tokens the draft model should propose for `seq` once this step samples it."""
        if self.config.method != "draft_model" or not self.active(num_running):
            return 0
        return 0 if seq.num_tokens + 1 < self._state(seq).paused_until else self.config.num_speculative_tokens

    def keep_proposals(self, seqs: list[Sequence], proposals: list[list[int]]) -> None:
        """The draft model's proposals after a step, per sampled sequence (none past the list's end)."""
        if self.config.method != "draft_model":
            return
        for i, seq in enumerate(seqs):
            self._state(seq).proposed = proposals[i] if i < len(proposals) else []

    def _state(self, seq: Sequence) -> SpeculativeState:
        if seq.speculation is None:
            seq.speculation = SpeculativeState(self.config)
        return seq.speculation

    def snapshot(self) -> SpecDecodeStats:
        return dataclasses.replace(self.stats, accepted_per_pos=list(self.stats.accepted_per_pos))

    def record(self, seq: Sequence, num_draft: int, num_accepted: int) -> None:
        stats = self.stats
        stats.num_drafts += 1
        stats.num_draft_tokens += num_draft
        stats.num_accepted_tokens += num_accepted
        for position in range(num_accepted):
            stats.accepted_per_pos[position] += 1
        state = self._state(seq)
        weight = ACCEPTANCE_WEIGHT
        state.acceptance = (1 - weight) * state.acceptance + weight * num_accepted / num_draft
        if state.acceptance < MIN_ACCEPTANCE:
            state.paused_until = seq.num_tokens + PAUSE_TOKENS
            state.acceptance = 1.0  # a fresh start after the pause
