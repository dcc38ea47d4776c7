"""Sampler: from one row of logits per sequence to one token per sequence, all rows in one
batch. Penalties, min_tokens, temperature, top-k, top-p and min-p are applied as tensors;
only seeded rows draw their noise one by one, from their own generator, which is what makes
a seeded request's output independent of whatever else shares the batch.

A failure belongs to the rows it comes from: when the batch fails, each row is sampled alone
(its generator first put back), and only a row that fails alone, or whose logits leave no token
to choose, reports an error; the others keep their tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from argosy.kernels import cpu_kernels
from argosy.server.engine.core_protocol import TokenLogprobs
from argosy.server.engine.sequence import Sequence

log = logging.getLogger("argosy.engine")
NO_TOKEN = "no token could be sampled: the sequence's logits hold no finite value (NaN, or every token masked)"


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    errors: list[str | None]  # per row: why it has no token (its request fails), else None


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]):
        self.eos_token_ids = list(eos_token_ids)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        seeded = [(s.generator, s.generator.get_state()) for s in seqs if s.generator is not None]
        try:
            return self._batch(logits, seqs)
        except Exception:
            log.exception("sampling a batch of %d rows failed: sampling each alone", len(seqs))
        for generator, state in seeded:
            generator.set_state(state)
        rows = [self._sample_alone(logits[i : i + 1], seq) for i, seq in enumerate(seqs)]
        return SamplerOutput(*(list(column) for column in zip(*rows)))

    def _sample_alone(self, logits: torch.Tensor, seq: Sequence) -> tuple[int, TokenLogprobs | None, str | None]:
        try:
            out = self._batch(logits, [seq])
        except Exception as exc:
            log.exception("sampling failed for request %s", seq.request.request_id)
            return 0, None, f"sampling failed: {type(exc).__name__}: {exc}"
        return out.token_ids[0], out.logprobs[0], out.errors[0]

    def _batch(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        """`logits` in the model's dtype: greedy rows take their argmax there (widening is
        exact, so the choice is the same), and only what needs arithmetic is widened to float32."""
        want_logprobs, sampled, edited = [], [], False
        for i, s in enumerate(seqs):  # one pass: this runs for every sequence at every step
            p = s.params
            want_logprobs.append(p.logprobs is not None)
            if not p.greedy:
                sampled.append(i)
            edited = edited or p.has_penalties or (p.min_tokens and s.num_output_tokens < p.min_tokens)
        # Reported log-probabilities are those of the model itself, before any processing.
        raw_logprobs = torch.log_softmax(logits.float(), dim=-1) if any(want_logprobs) else None
        if edited:
            logits = logits.to(torch.float32, copy=True)  # edited in place below; the caller's stays as it was
            _apply_penalties(logits, seqs)
            self._apply_min_tokens(logits, seqs)
        tokens = greedy_tokens(logits)
        # A greedy row's choice is usable if its logit is finite; a sampled row's, if it had a chance.
        usable = logits.gather(1, tokens[:, None]).view(-1).isfinite()
        if sampled:
            rows = torch.tensor(sampled, device=logits.device)
            tokens[rows], usable[rows] = _draw(logits[rows].float(), [seqs[i] for i in sampled])
        token_ids, usable_rows = tokens.tolist(), usable.tolist()
        logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        if raw_logprobs is not None:
            logprobs = _logprobs(raw_logprobs, tokens, seqs, want_logprobs)
        return SamplerOutput(token_ids, logprobs, [None if ok else NO_TOKEN for ok in usable_rows])

    def _apply_min_tokens(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        for i, seq in enumerate(seqs):
            if seq.num_output_tokens < seq.params.min_tokens:
                banned = list(seq.params.stop_token_ids)
                if not seq.params.ignore_eos:
                    banned += self.eos_token_ids
                logits[i, banned] = float("-inf")


def _draw(logits: torch.Tensor, seqs: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's drawn token, and whether it had a chance (a probability above zero: rows whose
    logits hold no finite value draw from NaN)."""
    params = [s.params for s in seqs]
    device = logits.device
    logits = logits / torch.tensor([p.temperature for p in params], device=device)[:, None]
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    top_p = torch.tensor([p.top_p for p in params], device=device)
    if (top_k < vocab).any() or (top_p < 1.0).any():
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        sorted_logits.masked_fill_(torch.arange(vocab, device=device)[None, :] >= top_k[:, None], float("-inf"))
        # Over what top-k kept, a token is dropped once the tokens before it cover top_p.
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        drop = (torch.cumsum(sorted_probs, dim=-1) - sorted_probs) > top_p[:, None]
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    min_p = torch.tensor([p.min_p for p in params], device=device)
    if (min_p > 0).any():
        probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    # argmax(p / E) with E ~ Exp(1) draws a token with probability proportional to p.
    noise = torch.empty_like(probs).exponential_()
    for i, seq in enumerate(seqs):
        if seq.generator is not None:
            noise[i] = torch.empty(vocab).exponential_(generator=seq.generator).to(device)
    # A zero draw would turn a dropped token's 0 / 0 into NaN, which argmax picks.
    tokens = (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)
    return tokens, probs.gather(1, tokens[:, None]).squeeze(1) > 0


def _apply_penalties(logits: torch.Tensor, seqs: list[Sequence]) -> None:
    rows = [i for i, s in enumerate(seqs) if s.params.has_penalties]
    if not rows:
        return
    device, vocab = logits.device, logits.shape[-1]
    chosen = [seqs[i] for i in rows]
    counts = _token_counts([s.output_token_ids for s in chosen], vocab, device)
    in_prompt = _token_counts([s.token_ids[: s.num_prompt_tokens] for s in chosen], vocab, device) > 0
    rep = torch.tensor([s.params.repetition_penalty for s in chosen], device=device)[:, None]
    freq = torch.tensor([s.params.frequency_penalty for s in chosen], device=device)[:, None]
    pres = torch.tensor([s.params.presence_penalty for s in chosen], device=device)[:, None]
    sub = logits[rows]
    seen = in_prompt | (counts > 0)
    sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - freq * counts - pres * (counts > 0).float()
    logits[rows] = sub


def _token_counts(token_lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in token_lists), default=0)
    padded = torch.tensor([t + [vocab] * (width - len(t)) for t in token_lists], dtype=torch.long, device=device).view(
        len(token_lists), width
    )
    counts = torch.zeros(len(token_lists), vocab + 1, device=device)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab]


def _logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, seqs: list[Sequence], wanted: list[bool]
) -> list[TokenLogprobs | None]:
    k = max((s.params.logprobs or 0) for s in seqs)
    chosen = raw.gather(1, tokens[:, None]).squeeze(1)
    ranks = (raw > chosen[:, None]).sum(dim=-1) + 1
    top_values, top_ids = raw.topk(k, dim=-1) if k else (raw[:, :0], tokens[:, None][:, :0])
    chosen, ranks, top_values, top_ids = chosen.tolist(), ranks.tolist(), top_values.tolist(), top_ids.tolist()
    result: list[TokenLogprobs | None] = []
    for i, seq in enumerate(seqs):
        if not wanted[i]:
            result.append(None)
            continue
        n = seq.params.logprobs
        result.append(TokenLogprobs(int(tokens[i]), chosen[i], ranks[i], list(zip(top_ids[i][:n], top_values[i][:n]))))
    return result


ARGMAX_CHUNK = 1024


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax (its first maximum, as torch.argmax). On CPU by the C++ kernel, or
    without it in two passes, because a vectorized `amax` over chunks of the vocabulary, then
    an argmax within the one chunk holding the maximum, is ten times faster there than argmax
    over bfloat16 rows."""
    rows, vocab = logits.shape
    if logits.device.type != "cpu" or vocab < 2 * ARGMAX_CHUNK:
        return logits.argmax(dim=-1)
    if cpu_kernels.cpu_kernels() is not None and logits.stride(1) == 1:
        return cpu_kernels.greedy_argmax(logits)
    whole = vocab - vocab % ARGMAX_CHUNK
    maxes = logits[:, :whole].view(rows, whole // ARGMAX_CHUNK, ARGMAX_CHUNK).amax(dim=-1)
    if whole < vocab:
        maxes = torch.cat([maxes, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=1)
    first_chunk = (maxes == maxes.amax(dim=-1, keepdim=True)).to(torch.uint8).argmax(dim=-1)
    start = first_chunk * ARGMAX_CHUNK
    # The last chunk may be short: its columns are clamped onto the last token, which only
    # repeats a value after its first occurrence.
    columns = (start[:, None] + torch.arange(ARGMAX_CHUNK, device=logits.device)).clamp_(max=vocab - 1)
    return start + logits.gather(1, columns).float().argmax(dim=-1)
