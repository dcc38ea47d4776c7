"""The rules that shape a row's distribution before a token is drawn, each written once.

Edits change the logits of any row that asks for them, greedy or not: logit_bias, penalties,
the ban of stop tokens under min_tokens, and a grammar's mask (structured/grammar_mask.py). Each says which rows it
wants and edits a float32 copy in place; when none wants a row, greedy rows take their argmax
on the model's logits untouched (the fast path). Transforms shape only the sampled rows:
temperature, top-k and top-p on the logits, then min-p on the probabilities.

On a GPU none of them waits for the device: what they decide they decide from the parameters on
the host, and the per-row parameters go to the device without a synchronisation."""

from __future__ import annotations

from typing import Protocol

import torch

from argosy.server.worker.sequence_states import SequenceState


def row_values(values: list, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Per-row values from the host, on the device: copied without waiting for the device (a
    tensor made on the device from a list would wait for every kernel queued before it)."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)


class LogitsEdit(Protocol):
    def rows(self, seqs: list[SequenceState]) -> list[int]:
        """The rows it changes (empty: none this step)."""
        ...

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list[SequenceState]) -> None:
        """Changes `logits` [batch, vocab] (float32) in place, at `rows`."""
        ...


class LogitBias:
    """OpenAI's logit_bias: each named token's logit moved by its bias, before the penalties (as
    vLLM orders them)."""

    def rows(self, seqs: list[SequenceState]) -> list[int]:
        return [i for i, s in enumerate(seqs) if s.params.logit_bias]

    def apply(self, logits: torch.Tensor, rows: list[int], seqs: list[SequenceState]) -> None:
        at, tokens, biases = [], [], []
        for i in rows:
            bias = seqs[i].params.logit_bias
            at += [i] * len(bias)
            tokens += bias.keys()
            biases += bias.values()
        index = (row_values(at, logits.device, torch.long), row_values(tokens, logits.device, torch.long))
        logits.index_put_(index, row_values(biases, logits.device, logits.dtype), accumulate=True)


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
        rep = row_values([s.params.repetition_penalty for s in chosen], device)[:, None]
        freq = row_values([s.params.frequency_penalty for s in chosen], device)[:, None]
        pres = row_values([s.params.presence_penalty for s in chosen], device)[:, None]
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
            logits[i, row_values(banned, logits.device, torch.long)] = float("-inf")


class LogitsTransform(Protocol):
    def __call__(self, x: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
        """x [sampled rows, vocab] float32, one row per seq; returns it shaped (maybe the same)."""
        ...


def temperature(logits: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    return logits / row_values([s.params.temperature for s in seqs], logits.device)[:, None]


def top_k_top_p(logits: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    """Keeps each row's top_k tokens, then, of those, the fewest whose probability covers top_p."""
    device, vocab = logits.device, logits.shape[-1]
    if not any(0 < s.params.top_k < vocab or s.params.top_p < 1.0 for s in seqs):
        return logits
    top_k = row_values([s.params.top_k if s.params.top_k > 0 else vocab for s in seqs], device)
    top_p = row_values([s.params.top_p for s in seqs], device)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    sorted_logits.masked_fill_(torch.arange(vocab, device=device)[None, :] >= top_k[:, None], float("-inf"))
    # Over what top-k kept, a token is dropped once the tokens before it cover top_p.
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > top_p[:, None]
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))


def min_p(probs: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    """On probabilities: drops tokens below min_p times the row's most likely one."""
    if not any(s.params.min_p > 0 for s in seqs):
        return probs
    threshold = row_values([s.params.min_p for s in seqs], probs.device)
    return probs.masked_fill(probs < threshold[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in token_lists), default=0)
    padded = row_values([t + [vocab] * (width - len(t)) for t in token_lists], device, torch.long)
    padded = padded.view(len(token_lists), width)
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]
