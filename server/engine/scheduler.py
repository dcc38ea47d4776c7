"""Scheduler: iteration-level batching. Every step, running sequences continue (a decode
token, or the next chunk of a long prompt) and waiting ones join in the order of the scheduling
policy (server/scheduling: first come first served, priorities, fair shares), under a token
budget and a sequence cap. When blocks run out, the running sequence furthest back in that
order (the most recently admitted, first come first served) is preempted: its blocks are freed,
it is recomputed later, and it keeps its place in the queue. Under the priority policy a
waiting request also preempts running ones behind it when it cannot be admitted, and the step
that admits it carries it and the running decodes only (prefill chunks behind it wait). With LoRA, a
waiting sequence whose adapter can get no device slot (all are held) is passed over, keeping
its place, until one idles; the ones behind it may go first. So is a sequence whose grammar is
still compiling. With speculative decoding, a running decode computes its last token and the
drafts the Speculator proposes, if their blocks are free; otherwise it decodes plainly. A draft
model's proposals, written on the device after sampling, take slots past those (lookahead),
when free; unkept, they go back with the refused drafts' slots. With a KV connector (the host
tier is one), a waiting sequence whose next blocks the connector can supply is admitted with
them: it holds its seat and its blocks but computes nothing, and is never preempted, until the
step results report its loads done (one step for the host tier, several for a slower connector),
holding up no one; a load that failed leaves it to compute those blocks again. With pipeline
parallelism P steps are in flight at once (EngineCore), each a micro-batch of at most 1/P of the
seats in use: a sequence sits out the steps in flight while its token is computed, and the
running sequences fall into P groups that take turns (the micro-batch schedule)."""

from __future__ import annotations

import itertools
from collections import deque

from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.scheduler_output import ScheduledSequence, SchedulerOutput
from argosy.server.engine.sequence import Sequence, SequenceStatus
from argosy.server.executor.plan import PLACEHOLDER
from argosy.server.kv_connector.output import KVConnectorOutput
from argosy.server.lora.manager import LoRAManager
from argosy.server.scheduling.policy import MIN_RUN_STEPS, SchedulingPolicy
from argosy.server.scheduling.waiting_queue import FairQueue, WaitingQueue
from argosy.server.spec_decode.speculator import Speculator


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        adapters: LoRAManager | None = None,
        speculator: Speculator | None = None,
        policy: SchedulingPolicy = "fcfs",
        micro_batches: int = 1,
    ):
        self.kv = kv
        self.adapters = adapters
        self.speculator = speculator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.policy = policy
        self.micro_batches = micro_batches
        self.waiting = FairQueue() if policy == "fair" else WaitingQueue(policy)
        self.running: list[Sequence] = []
        self.steps = 0  # schedules made: the clock of priority aging and of MIN_RUN_STEPS
        self._arrivals = itertools.count()
        self.preemptions = {"memory": 0, "priority": 0}  # by cause
        self.recomputed_tokens = 0  # tokens preempted sequences computed again
        self._finished: list[int] = []  # ids of the sequences finished since the last take

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions.values())

    def add(self, seq: Sequence) -> None:
        """A new request's sequence: its place is fixed now."""
        seq.request.arrival_no, seq.request.arrival_step = next(self._arrivals), self.steps
        self.waiting.add(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        self.steps += 1
        budget = self.max_num_batched_tokens
        # Under priorities, a waiting sequence ahead of running ones that can be admitted now
        # (after the preemptions it needs) jumps: its first step carries it and the running
        # decodes, while the prefill chunks behind it wait a step.
        place = self.waiting.place
        jumping = self._preempt_for_priority(out) if self.policy == "priority" else None
        # Victims are taken from the back: under priorities, the running sequence furthest behind.
        running = [seq for seq in self.running if _schedulable(seq)]
        queue = deque(sorted(running, key=place) if self.policy == "priority" else running)
        speculating = self.speculator is not None and self.speculator.active(len(self.running))
        memory_short = False
        seats = self._micro_batch_seats()
        while queue and budget > 0 and len(out.scheduled) < seats:
            seq = queue.popleft()
            remaining = seq.num_tokens - seq.num_computed_tokens
            if jumping is not None and remaining > 1 and place(seq) > place(jumping):
                continue
            num_new = min(remaining, budget)
            if speculating and num_new == seq.num_tokens - seq.num_computed_tokens == 1:
                draft = self.speculator.propose(seq, budget - 1)
                lookahead = self.speculator.lookahead(seq, 1 + len(draft))
                # With the draft model's slots if free, else without; else it decodes plainly.
                if (lookahead and self.kv.allocate(seq, 1 + len(draft) + lookahead)) or (
                    draft and self.kv.allocate(seq, 1 + len(draft))
                ):
                    out.scheduled.append(ScheduledSequence(seq, 1, draft))
                    budget -= 1 + len(draft)
                    continue
            while not self.kv.allocate(seq, num_new):
                victim = queue.pop() if queue else seq
                if victim.num_pending:  # its last token is still a placeholder: it sits this step out instead
                    if victim is seq:
                        break
                    continue
                self._preempt(victim, "memory")
                out.preempted.append(victim)
                memory_short = True
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
        self.waiting.charge(out.scheduled)  # admissions are charged as they are made: fair shares order them
        if not memory_short:
            budget = self._admit(out, budget, seats, jumping)
        out.blocks_to_copy = self.kv.take_pending_copies()
        out.kv_connector = self.kv.take_connector_meta()
        return out

    @property
    def loading(self) -> bool:
        """A sequence waits for its blocks to load."""
        return any(seq.loading_kv for seq in self.running)

    def kv_loads_done(self, output: KVConnectorOutput) -> None:
        """A step's report of the connector: the sequences whose loads ended compute from the next step."""
        for seq, loaded, lost in self.kv.take_connector_output(output):
            seq.loading_kv = False
            if seq.preempted:
                self.recomputed_tokens += lost
            else:
                self.kv.count_loaded(loaded)
                seq.request.num_cached_tokens -= lost

    def _micro_batch_seats(self) -> int:
        """The sequences one step may carry: all of them, or with P micro-batches in flight, 1/P
        of the seats in use or wanted (so that the batches stay even as requests come and go)."""
        if self.micro_batches == 1:
            return self.max_num_seqs
        wanted = min(self.max_num_seqs, len(self.running) + len(self.waiting))
        return max(1, -(-wanted // self.micro_batches))

    def _admit(self, out: SchedulerOutput, budget: int, seats: int, jumping: Sequence | None = None) -> int:
        """Admits waiting sequences in order while they fit, up to `seats` scheduled in all; after `jumping`, none."""
        reserved = self._reserved_seats()
        for seq in self.waiting.ordered():
            if (
                budget <= 0
                or len(out.scheduled) >= seats
                or not self._has_seat(seq, reserved)
                or (jumping is not None and jumping.is_running)
            ):
                break
            if not self._ready(seq):  # passed over, keeping its place
                continue
            cached, loaded, remaining = self._uncached(seq)
            if remaining > budget and not self.enable_chunked_prefill:
                break
            num_new = _first_chunk(loaded, remaining, budget)
            if not self.kv.allocate(seq, num_new, cached, loaded):
                break
            seq.loading_kv = loaded > 0
            if self.adapters is not None:
                self.adapters.admit(seq.request)
            if seq.preempted:  # a recomputation finding its own blocks is no cache hit
                self.recomputed_tokens += max(0, seq.num_computed_before_preemption - seq.num_computed_tokens)
            else:  # the loaded tokens count as hits once their loads are done
                self.kv.count_prefix_query(seq.num_tokens, seq.num_computed_tokens - loaded * self.kv.block_size)
                seq.request.num_cached_tokens = seq.num_computed_tokens
            reserved += seq.request.num_pending_forks
            self.waiting.remove(seq)
            seq.status = SequenceStatus.RUNNING
            seq.admitted_step = self.steps
            self.running.append(seq)
            if num_new:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                self.waiting.charge(out.scheduled[-1:])
                budget -= num_new
        return budget

    def _reserved_seats(self) -> int:
        """Seats for the siblings that running requests with n > 1 fork once their prompt is done."""
        return sum(seq.request.num_pending_forks for seq in self.running)

    def _uncached(self, seq: Sequence) -> tuple[list[int], int, int]:
        """The cached blocks of a waiting sequence's prefix, how many blocks after them the KV
        connector can supply, and the tokens left to compute."""
        cached = self.kv.cached_prefix(seq)
        loaded = self.kv.external_prefix(seq, len(cached))
        return cached, loaded, seq.num_tokens - (len(cached) + loaded) * self.kv.block_size

    def _has_seat(self, seq: Sequence, reserved: int) -> bool:
        return len(self.running) + reserved + 1 + seq.request.num_pending_forks <= self.max_num_seqs

    def _ready(self, seq: Sequence) -> bool:
        """Not waiting for its grammar to compile or for a device slot for its adapter."""
        request = seq.request
        return not request.waiting_for_grammar and (self.adapters is None or self.adapters.can_admit(request))

    def _preempt_for_priority(self, out: SchedulerOutput) -> Sequence | None:
        """While the first ready waiting sequence has no seat or no blocks for its first chunk,
        preempts the running sequence furthest behind it, passing over one preempted for
        priority before that has not yet run MIN_RUN_STEPS steps since its return. Returns the
        waiting sequence if it is ahead of a running one and can be admitted now."""
        place = self.waiting.place
        first = next((seq for seq in self.waiting if self._ready(seq)), None)
        if first is None or not any(place(seq) > place(first) for seq in self.running):
            return None
        while not (self._has_seat(first, self._reserved_seats()) and self._has_blocks(first)):
            victims = [
                seq
                for seq in self.running
                if place(seq) > place(first) and self._may_preempt(seq) and _schedulable(seq) and not seq.num_pending
            ]
            if not victims:
                return None
            victim = max(victims, key=place)
            self._preempt(victim, "priority")
            out.preempted.append(victim)
        return first

    def _may_preempt(self, seq: Sequence) -> bool:
        return not seq.preempted_for_priority or self.steps - seq.admitted_step >= MIN_RUN_STEPS

    def _has_blocks(self, seq: Sequence) -> bool:
        cached, loaded, remaining = self._uncached(seq)
        num_new = _first_chunk(loaded, remaining, self.max_num_batched_tokens)
        return self.kv.can_allocate(seq, num_new, cached, loaded)

    def _preempt(self, seq: Sequence, cause: str) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_before_preemption = seq.num_computed_tokens
        seq.num_computed_tokens = 0
        seq.preempted = True
        seq.preempted_for_priority = seq.preempted_for_priority or cause == "priority"
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq)  # back to its place, ahead of everything that arrived after it
        self.preemptions[cause] += 1

    def advance(self, out: SchedulerOutput, kept: list[int] | None = None) -> None:
        """Records that the step's tokens are now in the cache: `kept[i]` of the i-th scheduled
        sequence's (all of them without `kept`); the slots of the others go back."""
        for i, item in enumerate(out.scheduled):
            seq = item.seq
            if kept is not None and kept[i] < item.num_new_tokens:
                seq.num_computed_tokens += kept[i]
                self.kv.trim(seq, seq.num_computed_tokens)
            else:
                seq.num_computed_tokens += item.num_new_tokens
            self.kv.cache_full_blocks(seq)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.kv.fork(parent, child)
        child.admitted_step = parent.admitted_step
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        """Takes a sequence out of its queue and returns its blocks (finished or aborted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.waiting.leave(seq)
        self.kv.free(seq, seq.request.options.pin_s)
        seq.status = SequenceStatus.FINISHED
        self._finished.append(seq.seq_id)

    def add_placeholders(self, seqs: list[Sequence], max_model_len: int) -> list[Sequence]:
        """Async scheduling: each of `seqs` (sampled by the step in flight) that surely goes on
        after it gets a placeholder for the token it samples there, so that it decodes in the next
        step too; returns those."""
        added = []
        for seq in seqs:
            p, num_tokens = seq.params, seq.num_tokens
            if (
                seq.is_finished
                or seq.num_pending
                or seq.num_computed_tokens != num_tokens
                or seq.request.num_pending_forks
                or (p.max_tokens is not None and seq.num_output_tokens + 1 >= p.max_tokens)
                or num_tokens + 1 >= max_model_len
            ):
                continue
            seq.token_ids.append(PLACEHOLDER)
            seq.num_pending = 1
            added.append(seq)
        return added

    def drop_placeholders(self, seqs: list[Sequence]) -> None:
        """The placeholders of sequences that were not scheduled after all."""
        for seq in seqs:
            if seq.num_pending:
                del seq.token_ids[-seq.num_pending :]
                seq.num_pending = 0

    def forget(self, seq: Sequence) -> None:
        """A sequence the device side was told of, ended before it was ever queued here."""
        seq.status = SequenceStatus.FINISHED
        self._finished.append(seq.seq_id)

    def take_finished(self) -> list[int]:
        """The ids of the sequences finished (or aborted) since the last call."""
        finished, self._finished = self._finished, []
        return finished


def _schedulable(seq: Sequence) -> bool:
    """Not waiting for its blocks to load, nor (with async scheduling) for the token a step in
    flight samples for it; only these run, or are preempted."""
    return not seq.loading_kv and seq.num_computed_tokens < seq.num_tokens


def _first_chunk(loaded: int, remaining: int, budget: int) -> int:
    """The tokens a waiting sequence computes in its first step: none while its blocks load
    through the KV connector (it computes once they are done)."""
    return 0 if loaded else min(remaining, budget)
