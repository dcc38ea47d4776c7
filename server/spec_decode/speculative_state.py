"""SpeculativeState: what speculation keeps of one sequence, in the engine's Sequence; a module
of its own so that the sequence and the speculator that reads it do not import each other."""

from __future__ import annotations

from argosy.server.spec_decode.config import SpeculativeConfig
from argosy.server.spec_decode.ngram import NgramIndex


class SpeculativeState:
    """What speculation keeps of one sequence: its n-gram index (ngram) or the draft model's
    last proposal (draft_model), and how its drafts fare."""

    __slots__ = ("acceptance", "index", "paused_until", "proposed")

    def __init__(self, config: SpeculativeConfig):
        self.index = None
        if config.method == "ngram":
            self.index = NgramIndex(config.prompt_lookup_min, config.prompt_lookup_max)
        self.proposed: list[int] = []  # what the draft model proposed after the sequence's last token
        self.acceptance = 1.0
        self.paused_until = 0  # the sequence's length before which it does not propose
