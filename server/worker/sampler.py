"""Sampler: from one row of logits per sequence to one token per sequence, all rows in one
batch, through the logits processors (logits_processors.py): the edits any row may ask for,
then, for sampled rows, the transforms and a draw. Only seeded rows draw their noise one by
one, from their own generator, which is what makes a seeded request's output independent of
whatever else shares the batch.

On a GPU a step waits for the device once: every result (tokens, whether each had a chance,
log-probabilities) comes back to the host in one copy, and seeded noise is drawn on the device
by each sequence's own device generator.

A failure belongs to the rows it comes from: when the batch fails, each row is sampled alone
(its generator first put back), and only a row that fails alone, or whose logits leave no token
to choose, reports an error; the others keep their tokens."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from argosy.kernels import cpu_kernels
from argosy.server.executor.plan import TokenLogprobs
from argosy.server.structured.grammar_mask import GrammarMask
from argosy.server.worker.logits_processors import (
    LogitBias,
    LogitsEdit,
    LogitsTransform,
    MinTokens,
    Penalties,
    min_p,
    row_values,
    temperature,
    top_k_top_p,
)
from argosy.server.worker.sequence_states import SequenceState

log = logging.getLogger("argosy.engine")
NO_TOKEN = "no token could be sampled: the sequence's logits hold no finite value (NaN, or every token masked)"


@dataclass
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[TokenLogprobs | None]
    errors: list[str | None]  # per row: why it has no token (its request fails), else None


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...]):
        self.edits: list[LogitsEdit] = [LogitBias(), Penalties(), MinTokens(eos_token_ids), GrammarMask()]
        self.logits_transforms: list[LogitsTransform] = [temperature, top_k_top_p]
        self.probs_transforms: list[LogitsTransform] = [min_p]

    def __call__(self, logits: torch.Tensor, seqs: list[SequenceState]) -> SamplerOutput:
        seeded = [(s.generator, s.generator.get_state()) for s in seqs if s.generator is not None]
        try:
            return self._batch(logits, seqs)
        except Exception:
            log.exception("sampling a batch of %d rows failed: sampling each alone", len(seqs))
        for generator, state in seeded:
            generator.set_state(state)
        rows = [self._sample_alone(logits[i : i + 1], seq) for i, seq in enumerate(seqs)]
        return SamplerOutput(*(list(column) for column in zip(*rows)))

    def _sample_alone(self, logits: torch.Tensor, seq: SequenceState) -> tuple[int, TokenLogprobs | None, str | None]:
        try:
            out = self._batch(logits, [seq])
        except Exception as exc:
            log.exception("sampling failed for request %s", seq.request_id)
            return 0, None, f"sampling failed: {type(exc).__name__}: {exc}"
        return out.token_ids[0], out.logprobs[0], out.errors[0]

    def _batch(self, logits: torch.Tensor, seqs: list[SequenceState]) -> SamplerOutput:
        scores = self.score(logits, seqs)
        tokens, usable, sampled = scores.tokens, scores.usable, scores.sampled
        if sampled:
            rows = row_values(sampled, logits.device, torch.long)
            drawn = draw(scores.probs, [seqs[i] for i in sampled])
            tokens[rows], usable[rows] = drawn, scores.probs.gather(1, drawn[:, None]).squeeze(1) > 0
        if scores.raw_logprobs is None:
            token_ids, usable_rows = torch.stack((tokens, usable.to(tokens.dtype))).tolist()  # the one transfer
            logprobs: list[TokenLogprobs | None] = [None] * len(seqs)
        else:
            wanted = [s.params.logprobs is not None for s in seqs]
            token_ids, usable_rows, logprobs = with_logprobs(scores.raw_logprobs, tokens, usable, seqs, wanted)
        return SamplerOutput(token_ids, logprobs, [None if ok else NO_TOKEN for ok in usable_rows])

    def score(self, logits: torch.Tensor, seqs: list[SequenceState]) -> RowScores:
        """Every row through its edits; greedy rows' choices, and sampled rows' distributions.
        `logits` in the model's dtype: greedy rows that no edit touches take their argmax
        there (widening is exact, so the choice is the same); only what needs arithmetic is
        widened to float32."""
        want_logprobs, sampled = False, []
        for i, s in enumerate(seqs):  # one pass: this runs for every sequence at every step
            p = s.params
            want_logprobs = want_logprobs or p.logprobs is not None
            if not p.greedy:
                sampled.append(i)
        # Reported log-probabilities are those of the model itself, before any processing.
        raw_logprobs = torch.log_softmax(logits.float(), dim=-1) if want_logprobs else None
        edits = [(edit, rows) for edit in self.edits if (rows := edit.rows(seqs))]
        if edits:
            logits = logits.to(torch.float32, copy=True)  # edited in place; the caller's stays as it was
            for edit, rows in edits:
                edit.apply(logits, rows, seqs)
        tokens = greedy_tokens(logits)
        # A greedy row's choice is usable if its logit is finite.
        usable = logits.gather(1, tokens[:, None]).view(-1).isfinite()
        probs = None
        if sampled:
            probs = self._probs(
                logits[row_values(sampled, logits.device, torch.long)].float(), [seqs[i] for i in sampled]
            )
        return RowScores(tokens, usable, sampled, probs, raw_logprobs)

    def _probs(self, logits: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
        """Each sampled row's distribution, after every transform its request asks for (rows
        whose logits hold no finite value hold NaN)."""
        for transform in self.logits_transforms:
            logits = transform(logits, seqs)
        probs = torch.softmax(logits, dim=-1)
        for transform in self.probs_transforms:
            probs = transform(probs, seqs)
        return probs


@dataclass
class RowScores:
    tokens: torch.Tensor  # [rows] each row's argmax after its edits: a greedy row's choice
    usable: torch.Tensor  # [rows] bool: that choice's logit is finite
    sampled: list[int]  # the rows that draw
    probs: torch.Tensor | None  # [sampled, vocab] their distributions
    raw_logprobs: torch.Tensor | None  # [rows, vocab] the model's own, when a row asks for them


def draw(probs: torch.Tensor, seqs: list[SequenceState]) -> torch.Tensor:
    """One token per row, with probability proportional to `probs` (which need not sum to 1):
    argmax(p / E) with E ~ Exp(1); a seeded row's noise comes from its own generator, on the
    device the probabilities are on."""
    noise = torch.empty_like(probs).exponential_()
    for i, seq in enumerate(seqs):
        if seq.generator is not None:
            noise[i].exponential_(generator=seq.generator)
    # A zero draw would turn a dropped token's 0 / 0 into NaN, which argmax picks.
    return (probs / noise.clamp_min_(1e-20)).argmax(dim=-1)


def with_logprobs(
    raw: torch.Tensor, tokens: torch.Tensor, usable: torch.Tensor, seqs: list[SequenceState], wanted: list[bool]
) -> tuple[list[int], list[bool], list[TokenLogprobs | None]]:
    """Tokens, usability and log-probabilities, brought to the host in one copy: float64 holds
    token ids and ranks exactly, and float32 log-probabilities unchanged."""
    k = max((s.params.logprobs or 0) for s in seqs)
    chosen = raw.gather(1, tokens[:, None])
    ranks = (raw > chosen).sum(dim=-1, keepdim=True) + 1
    top_values, top_ids = raw.topk(k, dim=-1) if k else (raw[:, :0], tokens[:, None][:, :0])
    columns = (tokens[:, None], usable[:, None], chosen, ranks, top_values, top_ids)
    host = torch.cat([c.to(torch.float64) for c in columns], dim=1).tolist()  # the one transfer
    token_ids, usable_rows, logprobs = [], [], []
    for row, seq, want in zip(host, seqs, wanted):
        token_id = int(row[0])
        token_ids.append(token_id)
        usable_rows.append(row[1] != 0)
        if not want:
            logprobs.append(None)
            continue
        n = seq.params.logprobs
        top = [(int(i), v) for v, i in zip(row[4 : 4 + n], row[4 + k : 4 + k + n])]
        logprobs.append(TokenLogprobs(token_id, row[2], int(row[3]), top))
    return token_ids, usable_rows, logprobs


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
