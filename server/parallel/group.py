"""TensorParallel: one rank's place in a tensor-parallel group and its collective. The group is
torch.distributed's: NCCL between GPUs, gloo between CPU processes, so that tensor parallelism
runs, and is tested, on machines without a GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from argosy.server.parallel.layout import ShardLayout


@dataclass(frozen=True)
class TensorParallel:
    layout: ShardLayout
    group: Any = None  # the ranks' process group; None with one rank

    @property
    def all_reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Sums a partial output across the ranks, in place; None with one rank (nothing to sum)."""
        if self.layout.size == 1:
            return None
        group = self.group

        def reduce(x: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(x, group=group)
            return x

        return reduce


SINGLE = TensorParallel(ShardLayout(0, 1))


def join_group(rank: int, size: int, init_method: str, device: torch.device) -> TensorParallel:
    """Joins the ranks' group (every rank calls this with the same `init_method`, a
    `tcp://host:port` or `file://` rendezvous) and returns this rank's place in it."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size)
    return TensorParallel(ShardLayout(rank, size), dist.group.WORLD)
