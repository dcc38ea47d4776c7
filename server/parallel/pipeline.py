"""PipelineParallel: one rank's stage of a pipeline and the channel its activations travel on.
A stage after the first receives the hidden states and the residual stream of every token of the
step from the stage before; a stage before the last sends its own to the stage after. Each
tensor-parallel rank of a stage talks to the rank of the same index in the next stage (after the
all-reduces every rank of a stage holds the whole activations). The channel is a process group of
every rank of the engine: gloo between CPU processes, NCCL between GPUs; its CPU twin (gloo) also
settles what every rank must agree on (the KV cache's block count)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from argosy.server.parallel.collectives import min_over
from argosy.server.parallel.stages import PipelineStage

Carried = tuple[torch.Tensor, torch.Tensor]  # (hidden states, residual stream) of a step's tokens


@dataclass(frozen=True)
class PipelineParallel:
    stage: PipelineStage
    tp_rank: int  # this rank's index within its stage's tensor-parallel group
    tp_size: int
    group: Any  # every rank of the engine, for the activations
    cpu_group: Any  # the same ranks over gloo
    sending: list = field(default_factory=list, compare=False)  # the sends of the last step's activations, unfinished

    @property
    def rank(self) -> int:
        """This rank's number among all the engine's: stage by stage."""
        return self._rank_of(self.stage.index)

    def _rank_of(self, stage: int) -> int:
        return stage * self.tp_size + self.tp_rank

    def send(self, carried: Carried) -> None:
        """This stage's activations to the next stage, on their way when this returns: the stage
        goes on to its next micro-batch while the next stage is still busy with the one before.
        The last step's sends complete first (the channel keeps the order of the steps)."""
        peer = self._rank_of(self.stage.index + 1)
        for work in self.sending:
            work.wait()
        self.sending[:] = [self.group.send([tensor.contiguous()], peer, tag) for tag, tensor in enumerate(carried)]

    def receive(self, num_tokens: int, hidden_size: int, dtype: torch.dtype, device: torch.device) -> Carried:
        """The previous stage's activations of a step of `num_tokens` tokens."""
        peer = self._rank_of(self.stage.index - 1)
        carried = []
        for tag in range(2):
            tensor = torch.empty(num_tokens, hidden_size, dtype=dtype, device=device)
            self.group.recv([tensor], peer, tag).wait()
            carried.append(tensor)
        return carried[0], carried[1]

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value`, every stage's included."""
        return min_over(self.cpu_group, value)
