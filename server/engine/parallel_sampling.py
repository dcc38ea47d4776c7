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

    def forks(self, completing: list[Sequence]) -> list[Fork | None]:
        """For each sequence that completes this step, its fork if its prompt is what completes."""
        found: list[Fork | None] = []
        for seq in completing:
            request = seq.request
            if seq.num_output_tokens == 0 and request.num_pending_forks:
                indices = range(len(request.seqs), request.params.n)
                found.append(Fork(seq, [(next(self.seq_ids), index) for index in indices]))
            else:
                found.append(None)
        return found

    def fork(self, fork: Fork) -> list[Sequence]:
        """The children, sharing the parent's blocks and progress; after the step has run."""
        parent = fork.parent
        children = [parent.fork(seq_id, index) for seq_id, index in fork.children]
        for child in children:
            parent.request.seqs.append(child)
            self.scheduler.fork(parent, child)
        return children
