"""The engine side of speculation alone: drafts within what a sequence may still emit, and the
per-sequence off-switch, which pauses a sequence whose drafts keep missing and tries again."""

from __future__ import annotations

from argosy.server.engine.sequence import Request, Sequence
from argosy.server.sampling_params import SamplingParams
from argosy.server.spec_decode.config import SpeculativeConfig
from argosy.server.spec_decode.speculator import MIN_ACCEPTANCE, PAUSE_TOKENS, Speculator

CONFIG = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2})


def sequence(tokens: list[int], max_tokens: int | None = 100) -> Sequence:
    return Sequence(0, Request("r", tokens, SamplingParams(max_tokens=max_tokens)), 0, tokens)


def test_a_draft_follows_the_latest_earlier_occurrence_and_stays_within_the_limits():
    seq = sequence([1, 2, 3, 4, 5, 6, 1, 2])
    assert Speculator(CONFIG, max_model_len=100).propose(seq, budget=8) == [3, 4, 5, 6]
    assert Speculator(CONFIG, max_model_len=100).propose(seq, budget=2) == [3, 4]
    assert Speculator(CONFIG, max_model_len=10).propose(seq, budget=8) == [3, 4]  # positions 8, 9
    short = sequence([1, 2, 3, 4, 5, 6, 1, 2], max_tokens=3)
    short.token_ids.append(3)  # one output so far: two more may come, one of them the target's own
    assert Speculator(CONFIG, max_model_len=100).propose(short, budget=8) == [4]


def test_a_sequence_whose_drafts_miss_pauses_then_tries_again():
    speculator = Speculator(CONFIG, max_model_len=1000)
    seq = sequence([1, 2, 3, 4, 5, 6, 1, 2])
    misses = 0
    while speculator.propose(seq, budget=8):
        speculator.record(seq, 4, 0)
        misses += 1
        assert misses < 10
    assert misses >= 2  # one miss is not enough to give up
    assert seq.speculation.paused_until == seq.num_tokens + PAUSE_TOKENS
    seq.token_ids += [7] * (PAUSE_TOKENS - 3) + [1, 2]  # still paused: the draft would be there
    assert speculator.propose(seq, budget=8) == []
    seq.token_ids += [1, 2, 3]
    assert speculator.propose(seq, budget=8) == [4, 5, 6, 1]  # 1, 2, 3 began the prompt


def test_a_sequence_whose_drafts_are_kept_never_pauses():
    speculator = Speculator(CONFIG, max_model_len=1000)
    seq = sequence([1, 2, 3, 4, 5, 6, 1, 2])
    for _ in range(50):
        assert speculator.propose(seq, budget=8)
        speculator.record(seq, 4, 1)  # a quarter kept: above MIN_ACCEPTANCE
    assert MIN_ACCEPTANCE < 0.25 and seq.speculation.acceptance > MIN_ACCEPTANCE
    assert speculator.stats.num_drafts == 50 and speculator.stats.accepted_per_pos == [50, 0, 0, 0]
