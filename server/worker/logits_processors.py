"""The rules that shape a row's distribution before a token is drawn, each written once.

Edits change the logits of any row that asks for them, greedy or not: penalties, and the ban
of stop tokens under min_tokens (a grammar's mask joins them later). Each says which rows it
wants and edits a float32 copy in place; when none wants a row, greedy rows take their argmax
on the model's logits untouched (the fast path). Transforms shape only the sampled rows:
temperature, top-k and top-p on the logits, then min-p on the probabilities."""

from __future__ import annotations

from typing import Protocol

import torch

from argosy.server.worker.sequence_states import SequenceState


class LogitsEdit(Protocol):
    def rows(self, seqs: list[SequenceState]) -> list[int]:
        """The rows it changes (empty: none this step)."""
        ...

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list[SequenceState]) -> None:
        """Changes `logits` [batch, vocab] (float32) in place, at `rows`."""
        ...


class Penalties:
    """Repetition, frequency and presence penalties, as vLLM applies them: repetition over the
    prompt and the output, frequency and presence over the output."""

    def rows(self, seqs: list[SequenceState]) -> list[int]:
        return [i for i, s in enumerate(seqs) if s.penalized]

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list[SequenceState]) -> None:
        device, vocab = logits.device, logits.shape[-1]
        chosen = [seqs[i] for i in rows]
        counts = _token_counts([s.output_token_ids for s in chosen], vocab, device)
        in_prompt = _token_counts([s.prompt_token_ids for s in chosen], vocab, device) > 0
        rep = torch.tensor([s.params.repetition_penalty for s in chosen], device=device)[:, None]
        freq = torch.tensor([s.params.frequency_penalty for s in chosen], device=device)[:, None]
        pres = torch.tensor([s.params.presence_penalty for s in chosen], device=device)[:, None]
        sub = logits[rows]
        seen = in_prompt | (counts > 0)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
        sub = sub - freq * counts - pres * (counts > 0).float()
        logits[rows] = sub


class MinTokens:
    """No stop token (eos unless ignored, and the request's stop_token_ids) while a sequence has
    fewer than min_tokens outputs."""

    def __init__(self, eos_token_ids: tuple[int, ...]):
        self.eos_token_ids = list(eos_token_ids)

    def rows(self, seqs: list[SequenceState]) -> list[int]:
        # Most requests have no min_tokens: for them the rule is never asked.
        return [i for i, s in enumerate(seqs) if s.params.min_tokens and not s.params.may_stop(s.num_output_tokens)]

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list[SequenceState]) -> None:
        for i in rows:
            params = seqs[i].params
            banned = list(params.stop_token_ids) + ([] if params.ignore_eos else self.eos_token_ids)
            logits[i, banned] = float("-inf")


class LogitsTransform(Protocol):
    def __call__(self, x: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
        """x [sampled rows, vocab] float32, one row per seq; returns it shaped (maybe the same)."""
        ...


def temperature(logits: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    return logits / torch.tensor([s.params.temperature for s in seqs], device=logits.device)[:, None]


def top_k_top_p(logits: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    """Keeps each row's top_k tokens, then, of those, the fewest whose probability covers top_p."""
    device, vocab = logits.device, logits.shape[-1]
    top_k = torch.tensor([s.params.top_k if s.params.top_k > 0 else vocab for s in seqs], device=device)
    top_p = torch.tensor([s.params.top_p for s in seqs], device=device)
    if not ((top_k < vocab).any() or (top_p < 1.0).any()):
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_logits.masked_fill_(torch.arange(vocab, device=device)[None, :] >= top_k[:, None], float("-inf"))
    # Over what top-k kept, a token is dropped once the tokens before it cover top_p.
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > top_p[:, None]
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def min_p(probs: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    """On probabilities: drops tokens below min_p times the row's most likely one."""
    threshold = torch.tensor([s.params.min_p for s in seqs], device=probs.device)
    if not (threshold > 0).any():
        return probs
    return probs.masked_fill(probs < threshold[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in token_lists), default=0)
    padded = torch.tensor([t + [vocab] * (width - len(t)) for t in token_lists], dtype=torch.long, device=device).view(
        len(token_lists), width
    )
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]
