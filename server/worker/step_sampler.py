"""StepSampler: what rank 0 does with a step's logits. Each row the plan names is sampled (or, with
a draft, verified), its tokens are kept in its sequence's state with its grammar following them,
and the draft model, if any, proposes the next drafts from the last token kept."""

from __future__ import annotations

import torch

from argosy.server.executor.plan import StepPlan, StepResult
from argosy.server.spec_decode.draft_model import DraftModel, ProposalStart
from argosy.server.spec_decode.verifier import DraftVerifier
from argosy.server.worker.sampler import Sampler
from argosy.server.worker.sequence_states import SequenceState, SequenceStates
from argosy.server.worker.step_inputs import SequenceChunk


class StepSampler:
    def __init__(self, eos_token_ids: tuple[int, ...]):
        self.sampler = Sampler(eos_token_ids)
        self.verifier = DraftVerifier(self.sampler)

    def __call__(
        self,
        plan: StepPlan,
        chunks: list[SequenceChunk],
        logits: torch.Tensor,
        states: SequenceStates,
        draft: DraftModel | None,
    ) -> StepResult:
        seqs = [states[s.seq_id] for s in plan.samples]
        drafts = [s.draft for s in plan.samples]
        num_drafted = sum(map(len, drafts))
        if len(plan.samples) + num_drafted > len(logits):  # parallel samples share their parent's row
            rows = [s.logits_row + j for s in plan.samples for j in range(1 + len(s.draft))]
            logits = logits[torch.tensor(rows, device=logits.device)]
        if num_drafted:
            out = self.verifier(logits, seqs, drafts)
            token_ids, logprobs, errors = out.token_ids, out.logprobs, out.errors
        else:
            sampled = self.sampler(logits, seqs)
            token_ids, errors = [[token_id] for token_id in sampled.token_ids], sampled.errors
            logprobs = [None if lp is None else [lp] for lp in sampled.logprobs]
        complete = []
        for row, (seq, tokens, error) in enumerate(zip(seqs, token_ids, errors)):
            if error is None:
                errors[row], ends = _keep(seq, tokens)
                if ends:
                    complete.append(row)
                    del tokens[ends:]
                    if logprobs[row] is not None:
                        del logprobs[row][ends:]
        proposals = [] if draft is None else _propose(plan, chunks, token_ids, errors, complete, draft, states)
        return StepResult(token_ids, logprobs, errors, complete, proposals)


def _propose(
    plan: StepPlan,
    chunks: list[SequenceChunk],
    token_ids: list[list[int]],
    errors: list[str | None],
    complete: list[int],
    draft: DraftModel,
    states: SequenceStates,
) -> list[list[int]]:
    """The draft model's proposals for the rows that asked, from each one's last kept token."""
    chunk_of = {c.seq_id: chunk for c, chunk in zip(plan.chunks, chunks)}
    rows, starts = [], []
    for row, sample in enumerate(plan.samples):
        tokens = token_ids[row]
        if not sample.propose or errors[row] is not None or row in complete or not tokens:
            continue
        chunk = chunk_of[sample.seq_id]
        # The kept tokens follow the chunk's own; the last of them is the next one to compute.
        position = chunk.start + len(chunk.token_ids) - chunk.num_draft + len(tokens) - 1
        rows.append(row)
        starts.append(ProposalStart(tokens[-1], position, chunk.block_table, chunk.table_row, sample.propose))
    if not starts:
        return []
    proposals: list[list[int]] = [[] for _ in plan.samples]
    for row, proposal in zip(rows, draft.propose(starts, states.tables)):
        proposals[row] = proposal
    return proposals


def _keep(seq: SequenceState, token_ids: list[int]) -> tuple[str | None, int]:
    """Appends a step's tokens to the sequence (its grammar following them): why they cannot
    be kept, and, where its grammar completes, how many tokens end it (0: it goes on)."""
    for kept, token_id in enumerate(token_ids, start=1):
        seq.output_token_ids.append(token_id)
        if seq.grammar is not None:
            if not seq.grammar.accept(token_id):
                return f"the sampled token {token_id} breaks the request's grammar", 0
            if seq.grammar.complete:
                return None, kept
    return None, 0
