"""The acceptance rule keeps the target's distribution: over many draws on small distributions
the emitted tokens' frequencies match the target's within a stated bound (6 standard errors per
token, so a correct rule fails about once in 10^8 runs), and a deliberately broken rule (the
refused position redrawn from p instead of the residual) falls outside it."""

from __future__ import annotations

import pytest
import torch

from argosy.server.spec_decode.rejection import accept_greedy, accept_sampled

DRAWS = 20_000
VOCAB = 5


def distributions(seed: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, VOCAB, generator=g) * 1.5, dim=-1)


def frequencies(rule, p: torch.Tensor, q: torch.Tensor | None, seed: int) -> torch.Tensor:
    """How often each token comes out first, the drafts drawn from q (or fixed where q is None)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB)
    for _ in range(DRAWS):
        draft = [1, 3] if q is None else [int(torch.multinomial(q[j], 1, generator=g)) for j in range(q.shape[0])]
        counts[rule(p, draft, q, g)[0]] += 1
    return counts / DRAWS


def within_bound(observed: torch.Tensor, expected: torch.Tensor) -> bool:
    error = (expected * (1 - expected) / DRAWS).sqrt().clamp(min=1e-4)
    return bool(((observed - expected).abs() <= 6 * error).all())


def broken(p, draft, q, g):
    """The rule with the refused position redrawn from p: it over-weights the drafted tokens."""
    guess = draft[0]
    q_guess = 1.0 if q is None else float(q[0, guess])
    if float(torch.rand((), generator=g)) < min(1.0, float(p[0, guess]) / q_guess):
        return [guess]
    return [int(torch.multinomial(p[0], 1, generator=g))]


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_the_first_token_keeps_the_target_distribution_and_a_broken_rule_does_not(with_draft_probs):
    p = distributions(1, 3)
    q = distributions(2, 2) if with_draft_probs else None
    assert within_bound(frequencies(accept_sampled, p, q, seed=3), p[0])
    assert not within_bound(frequencies(broken, p, q, seed=3), p[0])


def test_every_kept_token_keeps_it_when_drafts_come_from_the_target_itself():
    """Drafts drawn from p are always kept; all three positions then follow p's rows."""
    p = distributions(4, 3)
    g = torch.Generator().manual_seed(5)
    counts = torch.zeros(3, VOCAB)
    for _ in range(DRAWS):
        draft = [int(torch.multinomial(p[j], 1, generator=g)) for j in range(2)]
        kept = accept_sampled(p, draft, p[:2], g)
        assert kept[:2] == draft and len(kept) == 3
        for j, token in enumerate(kept):
            counts[j, token] += 1
    for j in range(3):
        assert within_bound(counts[j] / DRAWS, p[j])


def test_greedy_keeps_drafts_up_to_the_first_the_target_would_not_choose():
    assert accept_greedy([4, 5, 6, 7], [4, 5, 6]) == [4, 5, 6, 7]  # all kept, and one more
    assert accept_greedy([4, 9, 6, 7], [4, 5, 6]) == [4, 9]  # the target's own choice at the miss
    assert accept_greedy([3, 5], [4]) == [3]
    assert accept_greedy([8], []) == [8]
