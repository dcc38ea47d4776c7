"""StepPlanner: the scheduler's decision for a step, as a StepPlan for the device side. It
remembers which sequences the device side knows: a sequence is described there once, when first
scheduled (a fork when it is forked), its block table's changes go with its chunks, and a
finished sequence is named once so that its state there goes too."""

from __future__ import annotations

from argosy.server.engine.parallel_sampling import Fork
from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.scheduler_output import SchedulerOutput
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.executor.plan import NewSequence, SampleRow, ScheduledChunk, StepPlan


class StepPlanner:
    def __init__(self, scheduler: Scheduler):
        self.scheduler = scheduler
        self._known: set[int] = set()  # the sequences the device side holds

    def plan(self, out: SchedulerOutput, completing: list[Sequence], forks: dict[int, Fork]) -> StepPlan:
        """`completing`: the scheduled sequences whose logits are wanted, in schedule order,
        and the forks of some (by place); each samples from its own row, its children from it
        too; a sequence with a draft verifies it from its rows (one per draft token, and one)."""
        known = self._known
        finished = [seq_id for seq_id in self.scheduler.take_finished() if seq_id in known]
        known.difference_update(finished)
        new: list[NewSequence] = []
        chunks = []
        for item in out.scheduled:
            seq = item.seq
            if seq.seq_id not in known:
                known.add(seq.seq_id)
                request = seq.request
                params = request.params
                new.append(
                    NewSequence(
                        seq.seq_id,
                        request.request_id,
                        params,
                        request.prompt_token_ids,
                        params.seed_of(seq.index),
                        lora_slot=_slot(request),
                    )
                )
            start, changed = seq.num_computed_tokens, seq.block_table_changed_from
            blocks = None
            if changed is not None:
                blocks = (changed, seq.block_table[changed:])
                seq.block_table_changed_from = None
            draft = item.draft
            tokens = seq.token_ids[start : start + item.num_new_tokens - len(draft)] + draft
            chunks.append(ScheduledChunk(seq.seq_id, tokens, start, item.completes, blocks, len(draft)))
        drafts = {item.seq.seq_id: item.draft for item in out.scheduled if item.draft}
        speculator, num_running = self.scheduler.speculator, len(self.scheduler.running)
        samples, logits_row = [], 0
        for place, seq in enumerate(completing):
            draft = drafts.get(seq.seq_id, [])
            # A sequence forking now shares its last block with its children: none proposes into it.
            propose = 0 if speculator is None or place in forks else speculator.to_propose(seq, num_running)
            samples.append(SampleRow(seq.seq_id, logits_row, draft, propose))
            for seq_id, index in forks[place].children if place in forks else ():
                known.add(seq_id)
                request = seq.request
                seed = request.params.seed_of(index)
                new.append(
                    NewSequence(seq_id, request.request_id, request.params, [], seed, seq.seq_id, _slot(request))
                )
                samples.append(SampleRow(seq_id, logits_row))
            logits_row += 1 + len(draft)
        adapters = self.scheduler.adapters
        loads = [] if adapters is None else [(slot, ref.digest) for slot, ref in adapters.slots.take_loads()]
        return StepPlan(new, finished, chunks, out.blocks_to_copy, samples, loads, out.kv_connector)


def _slot(request: Request) -> int:
    return -1 if request.lora_slot is None else request.lora_slot
