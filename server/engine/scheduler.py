"""Scheduler: iteration-level batching. Every step, running sequences continue (a decode
token, or the next chunk of a long prompt) and waiting ones join, first come first served,
under a token budget and a sequence cap. When blocks run out, the most recently admitted
running sequence is preempted: its blocks are freed and it is recomputed later. With LoRA, a
waiting sequence whose adapter can get no device slot (all are held) is passed over, keeping
its place, until one idles; the ones behind it may go first. So is a sequence whose grammar is
still compiling. With speculative decoding, a running decode computes its last token and the
drafts the Speculator proposes, if their blocks are free; otherwise it decodes plainly. A draft
model's proposals, written on the device after sampling, take slots past those (lookahead),
when free; unkept, they go back with the refused drafts' slots."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.sequence import Sequence, SequenceStatus
from argosy.server.lora.manager import LoRAManager
from argosy.server.spec_decode.speculator import Speculator


class ScheduledSequence:
    __slots__ = ("completes", "draft", "num_new_tokens", "seq")

    def __init__(self, seq: Sequence, num_new_tokens: int, draft: list[int] | None = None):
        self.seq = seq
        self.draft = draft or []  # proposed tokens computed after the sequence's own, to verify
        # Tokens computed this step, from seq.num_computed_tokens: the sequence's, then the draft.
        self.num_new_tokens = num_new_tokens + len(self.draft)
        # After this step every token of the sequence is in the cache: sample the next.
        self.completes = seq.num_computed_tokens + num_new_tokens == seq.num_tokens

    def __repr__(self) -> str:
        return f"ScheduledSequence({self.seq!r}, {self.num_new_tokens})"


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        enable_chunked_prefill: bool,
        adapters: LoRAManager | None = None,
        speculator: Speculator | None = None,
    ):
        self.kv = kv
        self.adapters = adapters
        self.speculator = speculator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._finished: list[int] = []  # ids of the sequences finished since the last take

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        queue = deque(self.running)
        speculating = self.speculator is not None and self.speculator.active(len(self.running))
        while queue and budget > 0:
            seq = queue.popleft()
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
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
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            else:
                out.scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
        if not out.preempted:
            budget = self._admit(out, budget)
        out.blocks_to_copy = self.kv.take_pending_copies()
        return out

    def _admit(self, out: SchedulerOutput, budget: int) -> int:
        if not self.waiting:
            return budget
        # Seats for the siblings that requests with n > 1 will fork once their prompt is done.
        reserved = sum(seq.request.num_pending_forks for seq in self.running)
        passed_over: list[Sequence] = []  # their grammar or their adapter's slot is not ready
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            if len(self.running) + reserved + 1 + seq.request.num_pending_forks > self.max_num_seqs:
                break
            if seq.request.waiting_for_grammar or (
                self.adapters is not None and not self.adapters.can_admit(seq.request)
            ):
                passed_over.append(self.waiting.popleft())
                continue
            cached = self.kv.cached_prefix(seq)
            remaining = seq.num_tokens - len(cached) * self.kv.block_size
            if remaining > budget and not self.enable_chunked_prefill:
                break
            num_new = min(remaining, budget)
            if not self.kv.allocate(seq, num_new, cached):
                break
            if self.adapters is not None:
                self.adapters.admit(seq.request)
            if not seq.preempted:  # a recomputation finding its own blocks is no cache hit
                self.kv.count_prefix_query(seq.num_tokens, seq.num_computed_tokens)
                seq.request.num_cached_tokens = seq.num_computed_tokens
            reserved += seq.request.num_pending_forks
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
        self.waiting.extendleft(reversed(passed_over))
        return budget

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        seq.preempted = True
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

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
        self.running.append(child)

    def finish(self, seq: Sequence) -> None:
        """Takes a sequence out of its queue and returns its blocks (finished or aborted)."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        self._finished.append(seq.seq_id)

    def take_finished(self) -> list[int]:
        """The ids of the sequences finished (or aborted) since the last call."""
        finished, self._finished = self._finished, []
        return finished
