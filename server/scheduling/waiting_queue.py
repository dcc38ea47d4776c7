"""WaitingQueue: the sequences waiting to be admitted, in the order the scheduling policy admits
them. A sequence keeps its place when it is passed over (its grammar or adapter not ready) or
preempted: its place follows from its request's arrival, never from when it came back."""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

from argosy.server.engine.sequence import Sequence
from argosy.server.scheduling.fair_shares import FairShares
from argosy.server.scheduling.policy import AGING_STEPS, SchedulingPolicy

if TYPE_CHECKING:
    from argosy.server.engine.scheduler_output import ScheduledSequence


class WaitingQueue:
    """fcfs and priority: one list kept sorted by a place fixed at the request's arrival."""

    def __init__(self, policy: SchedulingPolicy = "fcfs"):
        self.policy = policy
        self._places: list[tuple[int, int, int]] = []  # sorted, beside _seqs
        self._seqs: list[Sequence] = []

    def place(self, seq: Sequence) -> tuple[int, int, int]:
        """Lower goes first: (aged priority, arrival order, output index)."""
        request = seq.request
        aged = request.priority * AGING_STEPS + request.arrival_step if self.policy == "priority" else 0
        return aged, request.arrival_no, seq.index

    def add(self, seq: Sequence) -> None:
        place = self.place(seq)
        at = bisect.bisect(self._places, place)
        self._places.insert(at, place)
        self._seqs.insert(at, seq)

    def remove(self, seq: Sequence) -> None:
        at = self._seqs.index(seq)
        del self._places[at], self._seqs[at]

    def ordered(self) -> Iterator[Sequence]:
        """In admission order; the queue may change while this is read."""
        return iter(list(self._seqs))

    def charge(self, scheduled: list[ScheduledSequence]) -> None:
        """The step's scheduled sequences are served their new tokens: fair shares count them;
        the other policies need not."""

    def leave(self, seq: Sequence) -> None:
        """`seq` finished (fair shares stop counting it as its user's work)."""

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self._seqs

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs)

    def __len__(self) -> int:
        return len(self._seqs)


class FairQueue(WaitingQueue):
    """fair: each user's sequences by arrival; the next comes from the least-served user."""

    def __init__(self) -> None:
        super().__init__("fair")
        self.shares = FairShares()

    def add(self, seq: Sequence) -> None:
        self.shares.arrive(seq.request.user, seq)
        super().add(seq)

    def ordered(self) -> Iterator[Sequence]:
        by_user: dict[str, list[Sequence]] = {}
        for seq in self._seqs:
            by_user.setdefault(seq.request.user or "", []).append(seq)
        heads = dict.fromkeys(by_user, 0)
        while heads:  # the served counts are read afresh for each pick: admitting charges them
            user = min(heads, key=lambda u: (self.shares.served(u), self.place(by_user[u][heads[u]])))
            yield by_user[user][heads[user]]
            heads[user] += 1
            if heads[user] == len(by_user[user]):
                del heads[user]

    def charge(self, scheduled: list[ScheduledSequence]) -> None:
        for item in scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            prompt = max(0, min(start + item.num_new_tokens, seq.num_prompt_tokens) - start)
            self.shares.charge(seq.request.user, prompt, item.num_new_tokens - prompt)

    def leave(self, seq: Sequence) -> None:
        self.shares.leave(seq.request.user, seq)
