"""The device side of verification on crafted logits: each position is processed as if the
draft's earlier tokens were the sequence's own (penalties, min_tokens), kept tokens report the
log-probabilities of their own position, the sampled rule keeps each position's transformed
distribution, and a row that cannot be verified fails alone."""

from __future__ import annotations

import math

import torch

from argosy.server.sampling_params import SamplingParams
from argosy.server.spec_decode.verifier import DraftVerifier
from argosy.server.worker.sampler import NO_TOKEN, Sampler
from argosy.server.worker.sequence_states import SequenceState

EOS = 9
VOCAB = 10


def seq(outputs=(), **params) -> SequenceState:
    p = SamplingParams(**params)
    s = SequenceState("r", p, [0], p.seed_of(0))
    s.output_token_ids.extend(outputs)
    return s


def verify(rows: list[list[float]], seqs, drafts):
    return DraftVerifier(Sampler((EOS,)))(torch.tensor(rows, dtype=torch.float32), seqs, drafts)


def peaked(*tokens: int, height: float = 5.0) -> list[list[float]]:
    """One row per token, each with that token far ahead (and token 1 second)."""
    rows = []
    for token in tokens:
        row = [0.0] * VOCAB
        row[1], row[token] = 4.0, height
        rows.append(row)
    return rows


def test_greedy_keeps_the_draft_to_its_first_miss_then_the_targets_choice():
    out = verify(peaked(3, 4, 6, 7), [seq(temperature=0)], [[3, 4, 5]])
    assert out.token_ids == [[3, 4, 6]]
    out = verify(peaked(3, 4, 5, 7), [seq(temperature=0)], [[3, 4, 5]])
    assert out.token_ids == [[3, 4, 5, 7]]  # all kept, and the token after them


def test_each_position_is_penalised_for_the_draft_tokens_before_it():
    # Token 3 leads every row by 1; a presence penalty of 2 drops it once the sequence has it.
    rows = peaked(3, 3, 3, height=5.0)
    out = verify(rows, [seq(temperature=0, presence_penalty=2.0)], [[3, 3]])
    assert out.token_ids == [[3, 1]]  # the second position already counts the first draft


def test_min_tokens_counts_the_draft_tokens_before_each_position():
    # EOS leads every row; min_tokens=2 bans it at the first two positions only.
    rows = peaked(EOS, EOS, EOS)
    out = verify(rows, [seq(temperature=0, min_tokens=2)], [[1, 1]])
    assert out.token_ids == [[1, 1, EOS]]


def test_kept_tokens_report_the_logprobs_of_their_own_position():
    rows = peaked(3, 4, 6)
    out = verify(rows, [seq(temperature=0, logprobs=2), seq(temperature=0)], [[3, 5], []])
    # The second sequence's single row is the fourth row: give it its own logits.
    expected = torch.log_softmax(torch.tensor(rows), dim=-1)
    first = out.logprobs[0]
    assert [lp.token_id for lp in first] == [3, 4]
    assert math.isclose(first[0].logprob, float(expected[0, 3]), rel_tol=1e-5)
    assert math.isclose(first[1].logprob, float(expected[1, 4]), rel_tol=1e-5)
    assert [t for t, _ in first[1].top] == [4, 1] and out.logprobs[1] is None


def test_the_sampled_rule_keeps_each_positions_transformed_distribution():
    # Position 0 at temperature 0.5 with top_k 4; the draft's token is the second likeliest.
    logits = torch.log(torch.tensor([0.05, 0.4, 0.3, 0.15, 0.1] + [1e-9] * 5))
    rows = torch.stack([logits, logits]).tolist()
    top4 = torch.full_like(logits, -math.inf).scatter(0, logits.topk(4).indices, logits.topk(4).values)
    kept_probs = torch.softmax(top4 / 0.5, dim=-1)
    draws = 12000
    seqs = [seq(temperature=0.5, top_k=4, seed=i) for i in range(draws)]
    out = verify(rows * draws, seqs, [[2]] * draws)
    counts = torch.bincount(torch.tensor([t[0] for t in out.token_ids]), minlength=VOCAB).double()
    sigma = torch.sqrt(draws * kept_probs.double() * (1 - kept_probs.double())).clamp_min(1)
    assert torch.all((counts - draws * kept_probs.double()).abs() <= 6 * sigma), (counts, draws * kept_probs)
    assert counts[0] == 0 and counts[5:].sum() == 0  # top_k dropped them at this position


def test_a_sequence_with_no_finite_logits_fails_alone():
    rows = peaked(3, 4) + [[float("nan")] * VOCAB] * 2
    out = verify(rows, [seq(temperature=0), seq(temperature=0.7)], [[3], [5]])
    assert out.token_ids[0] == [3, 4] and out.errors == [None, NO_TOKEN]
