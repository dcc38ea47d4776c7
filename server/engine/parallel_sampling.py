"""Parallel sampling (n > 1), in one place: a request's prompt is computed once, by its first
sequence; when the prompt is done, the other n - 1 sequences fork from it. They share its
blocks (a shared block is copied before anyone writes into it) and sample their first token
from the same logits row. The rest of the engine never branches on n.

A step decides its forks before it runs (`forks`: the children's ids, so that the plan can
name what to sample) and makes them after (`fork`: the children take the parent's progress)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.sequence import Sequence


@dataclass
class Fork:
    parent: Sequence
    children: list[tuple[int, int]]  # (seq id, index) of each sibling to fork


class ParallelSampling:
    def __init__(self, scheduler: Scheduler, seq_ids: Iterator[int]):
        self.scheduler, self.seq_ids = scheduler, seq_ids

    def forks(self, completing: list[Sequence]) -> dict[int, Fork]:
        """Of the sequences that complete this step, those whose prompt is what completes and
        that have siblings to fork: their forks, by their place in `completing`."""
        found = {}
        for row, seq in enumerate(completing):
            request = seq.request
            if request.params.n > 1 and seq.num_output_tokens == 0 and request.num_pending_forks:
                indices = range(len(request.seqs), request.params.n)
                found[row] = Fork(seq, [(next(self.seq_ids), index) for index in indices])
        return found

    def targets(self, completing: list[Sequence], forks: dict[int, Fork]) -> list[Sequence]:
        """The sequences to sample, after the step ran: `completing`, each followed by the
        children it forks into (made now), in the order of the plan's samples."""
        if not forks:
            return completing
        targets = []
        for row, seq in enumerate(completing):
            targets.append(seq)
            if row in forks:
                targets += self.fork(forks[row])
        return targets

    def fork(self, fork: Fork) -> list[Sequence]:
        """The children, sharing the parent's blocks and progress; after the step has run. A
        parent that ended while its step ran (async scheduling) forks none: the children stand
        for their rows of the step, already ended, and the device side forgets them."""
        parent = fork.parent
        children = [parent.fork(seq_id, index) for seq_id, index in fork.children]
        if parent.is_finished:
            for child in children:
                self.scheduler.forget(child)
            return children
        for child in children:
            parent.request.seqs.append(child)
            self.scheduler.fork(parent, child)
        return children
