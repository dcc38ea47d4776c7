"""DraftVerifier: the device side of speculative decoding. A sequence with a draft of k tokens
has k + 1 rows of logits, one per position: row j is what the target model says after the
draft's first j tokens. Each row goes through the sampler's edits and transforms as the
sequence would at that position had those tokens been its own (a DraftView: penalties count
the earlier drafts, min_tokens counts them, a grammar has accepted them), then the acceptance
rule (rejection.py) keeps a prefix of the draft and one token of the target's own. A grammar
cuts a draft at its first token the grammar refuses: no row after it could be used.

As the sampler's, a failure belongs to the rows it comes from: when the batch fails, each
sequence is verified alone (its generator first put back)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from argosy.server.executor.plan import TokenLogprobs
from argosy.server.spec_decode.rejection import accept_greedy, accept_sampled
from argosy.server.structured.grammar_mask import GrammarState
from argosy.server.worker.sampler import NO_TOKEN, RowScores, Sampler, with_logprobs
from argosy.server.worker.sequence_states import SequenceState

log = logging.getLogger("argosy.engine")


class DraftView:
    """A sequence as it would stand after the first tokens of its draft, for the logits
    processors (which read these fields only)."""

    __slots__ = (
        "generator",
        "grammar",
        "num_output_tokens",
        "output_token_ids",
        "params",
        "penalized",
        "prompt_token_ids",
        "request_id",
    )

    def __init__(self, seq: SequenceState, draft_prefix: list[int], grammar: GrammarState | None):
        self.params, self.penalized, self.request_id = seq.params, seq.penalized, seq.request_id
        self.prompt_token_ids, self.generator, self.grammar = seq.prompt_token_ids, seq.generator, grammar
        # Only penalties read the tokens themselves: the rest need not be copied.
        self.output_token_ids = seq.output_token_ids + draft_prefix if seq.penalized else seq.output_token_ids
        self.num_output_tokens = seq.num_output_tokens + len(draft_prefix)


@dataclass
class VerifiedOutput:
    token_ids: list[list[int]]  # per sequence: the draft's kept prefix, then the target's token
    logprobs: list[list[TokenLogprobs] | None]
    errors: list[str | None]


class DraftVerifier:
    def __init__(self, sampler: Sampler):
        self.sampler = sampler

    def __call__(self, logits: torch.Tensor, seqs: list[SequenceState], drafts: list[list[int]]) -> VerifiedOutput:
        """`logits`: 1 + len(draft) rows per sequence, in order."""
        seeded = [(s.generator, s.generator.get_state()) for s in seqs if s.generator is not None]
        try:
            return self._batch(logits, seqs, drafts)
        except Exception:
            log.exception("verifying the drafts of %d sequences failed: verifying each alone", len(seqs))
        for generator, state in seeded:
            generator.set_state(state)
        out, start = VerifiedOutput([], [], []), 0
        for seq, draft in zip(seqs, drafts):
            rows = logits[start : start + 1 + len(draft)]
            start += 1 + len(draft)
            try:
                alone = self._batch(rows, [seq], [draft])
            except Exception as exc:
                log.exception("verifying the draft of request %s failed", seq.request_id)
                alone = VerifiedOutput([[]], [None], [f"sampling failed: {type(exc).__name__}: {exc}"])
            for column, value in zip(
                (out.token_ids, out.logprobs, out.errors), (alone.token_ids, alone.logprobs, alone.errors)
            ):
                column += value
        return out

    def _batch(self, logits: torch.Tensor, seqs: list[SequenceState], drafts: list[list[int]]) -> VerifiedOutput:
        views: list[DraftView] = []
        rows: list[int] = []  # the logits rows verified: a grammar may cut a draft short
        cut: list[list[int]] = []
        start = 0
        for seq, draft in zip(seqs, drafts):
            grammars = None if seq.grammar is None else _grammar_positions(seq.grammar, draft)
            verified = draft if grammars is None else draft[: len(grammars) - 1]
            cut.append(verified)
            for j in range(len(verified) + 1):
                views.append(DraftView(seq, verified[:j], None if grammars is None else grammars[j]))
                rows.append(start + j)
            start += 1 + len(draft)
        if len(rows) < len(logits):
            logits = logits[torch.tensor(rows, device=logits.device)]
        return self._accept(self.sampler.score(logits, views), seqs, cut)

    def _accept(self, scores: RowScores, seqs: list[SequenceState], drafts: list[list[int]]) -> VerifiedOutput:
        choices, usable = torch.stack((scores.tokens, scores.usable.to(scores.tokens.dtype))).tolist()
        place = {row: i for i, row in enumerate(scores.sampled)}  # a sampled row's among the probabilities
        token_ids, errors, logprob_rows = [], [], []
        start = 0
        for seq, draft in zip(seqs, drafts):
            end = start + 1 + len(draft)
            if seq.params.greedy:
                kept = accept_greedy(choices[start:end], draft)
                ok = all(usable[start : start + len(kept)])
            else:
                probs = scores.probs[place[start] : place[start] + 1 + len(draft)]
                # Rows from the first with no finite value on are not used (a draw there is NaN).
                usable_rows = [*probs.isfinite().all(dim=-1).tolist(), False]
                probs = probs[: usable_rows.index(False)]
                kept = accept_sampled(probs, draft[: len(probs) - 1], None, seq.generator) if len(probs) else []
                ok = bool(kept) and all(float(probs[j, token]) > 0 for j, token in enumerate(kept))
            token_ids.append(kept if ok else [])
            errors.append(None if ok else NO_TOKEN)
            if ok and seq.params.logprobs is not None:
                logprob_rows += [(start + j, token, seq) for j, token in enumerate(kept)]
            start = end
        return VerifiedOutput(token_ids, self._logprobs(scores, seqs, token_ids, logprob_rows), errors)

    @staticmethod
    def _logprobs(scores: RowScores, seqs, token_ids, logprob_rows) -> list[list[TokenLogprobs] | None]:
        """Each kept token's, from the model's own distribution at its position."""
        if not logprob_rows:
            return [None] * len(seqs)
        rows, tokens, owners = zip(*logprob_rows)
        device = scores.raw_logprobs.device
        raw = scores.raw_logprobs[torch.tensor(rows, device=device)]
        chosen = torch.tensor(tokens, device=device)
        _, _, found = with_logprobs(
            raw, chosen, torch.ones_like(chosen, dtype=torch.bool), list(owners), [True] * len(rows)
        )
        out: list[list[TokenLogprobs] | None] = []
        for seq, kept in zip(seqs, token_ids):
            wanted = seq.params.logprobs is not None and kept
            out.append(found[: len(kept)] if wanted else None)
            found = found[len(kept) :] if wanted else found
        return out


def _grammar_positions(grammar: GrammarState, draft: list[int]) -> list[GrammarState]:
    """The grammar's state at each position of the draft, up to its first refused token."""
    states = [grammar]
    for token in draft:
        ahead = states[-1].fork()
        if not ahead.accept(token):
            break
        states.append(ahead)
    return states
