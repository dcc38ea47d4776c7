"""Parallel sampling (n > 1), in one place: a request's prompt is computed once, by its first
sequence; when the prompt is done, the other n - 1 sequences fork from it. They share its
blocks (a shared block is copied before anyone writes into it) and sample their first token
from the same logits row. The rest of the engine never branches on n."""

from __future__ import annotations

from collections.abc import Iterator

from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.sequence import Sequence


class ParallelSampling:
    def __init__(self, scheduler: Scheduler, seq_ids: Iterator[int]):
        self.scheduler, self.seq_ids = scheduler, seq_ids

    def expand(self, completing: list[Sequence]) -> tuple[list[Sequence], list[int] | None]:
        """The sequences to sample this step, `completing` with the forks of any whose prompt
        just finished, and each one's logits row (None: one row each, in order)."""
        targets, rows = [], []
        for row, seq in enumerate(completing):
            targets.append(seq)
            rows.append(row)
            if seq.num_output_tokens == 0:
                for child in self._fork(seq):
                    targets.append(child)
                    rows.append(row)
        return targets, (None if len(targets) == len(completing) else rows)

    def _fork(self, parent: Sequence) -> list[Sequence]:
        request = parent.request
        children = [parent.fork(next(self.seq_ids), index) for index in range(len(request.seqs), request.params.n)]
        for child in children:
            request.seqs.append(child)
            self.scheduler.fork(parent, child)
        return children
