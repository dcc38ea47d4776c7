"""The acceptance rule that keeps speculative decoding lossless. Greedy: the drafts are kept up
to the first the target model would not have chosen, then the target's own choice. Sampled: draft
token d at position j is kept with probability min(1, p_j(d) / q_j(d)); the first one refused is
replaced by a draw from the residual max(p_j - q_j, 0), normalised; when every draft is kept, a
last token is drawn from p_k. Each emitted token then has exactly the target's distribution (the
standard argument: P(d) = q(d) min(1, p/q) + (1 - sum_x min(p, q)) residual(d) = p(d)). A
proposer without probabilities (n-gram lookup) counts as q_j = 1 on its token."""

from __future__ import annotations

import torch


def accept_greedy(target_choices: list[int], draft: list[int]) -> list[int]:
    """target_choices: the target's argmax at each of the k + 1 positions."""
    kept: list[int] = []
    for choice, guess in zip(target_choices, draft):
        kept.append(choice)
        if choice != guess:
            return kept
    kept.append(target_choices[len(draft)])
    return kept


def accept_sampled(
    probs: torch.Tensor, draft: list[int], draft_probs: torch.Tensor | None, generator: torch.Generator | None
) -> list[int]:
    """probs: [k + 1, vocab] the target's distributions (after every transform the request
    asks for); draft_probs: [k, vocab] the proposer's, or None (q = 1 on its token)."""
    kept: list[int] = []
    for j, guess in enumerate(draft):
        p = probs[j]
        q_guess = 1.0 if draft_probs is None else float(draft_probs[j, guess])
        keep = min(1.0, float(p[guess]) / q_guess) if q_guess > 0 else 1.0
        if float(torch.rand((), generator=generator, device=p.device)) < keep:
            kept.append(guess)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[guess] = 0
        else:
            residual = (p - draft_probs[j]).clamp_(min=0)
        kept.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return kept
    kept.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return kept
