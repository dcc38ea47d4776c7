"""TensorParallel: one rank's place in a tensor-parallel group and its collective. The group is
torch.distributed's: NCCL between GPUs, gloo between CPU processes, so that tensor parallelism
runs, and is tested, on machines without a GPU."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.collectives import min_over
from argosy.server.parallel.layout import WHOLE, ShardLayout
from argosy.server.parallel.pipeline import PipelineParallel
from argosy.server.parallel.stages import split_layers
from argosy.server.parallel.vocab import VocabShard

_TIMEOUT = timedelta(minutes=10)  # a rank loading a large checkpoint may be slow to arrive


@dataclass(frozen=True)
class TensorParallel:
    layout: ShardLayout
    group: Any = None  # the ranks' process group for the device's collectives; None with one rank
    cpu_group: Any = None  # the same ranks over gloo, for the plans and the start-up figures

    @property
    def all_reduce(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """Sums a partial output across the ranks, in place; None with one rank (nothing to sum)."""
        if self.layout.size == 1:
            return None
        group = self.group

        def reduce(x: torch.Tensor) -> torch.Tensor:
            group.allreduce([x]).wait()
            return x

        return reduce

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` side by side in the last dimension, on rank 0; `x` itself on the others."""
        x = x.contiguous()
        if self.layout.rank:
            self.group.gather([], [x]).wait()
            return x
        parts = [torch.empty_like(x) for _ in range(self.layout.size)]
        self.group.gather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def vocab(self, cfg: ModelConfig) -> VocabShard | None:
        """This rank's rows of the embedding and the LM head; None with one rank (it holds them all)."""
        if self.layout.size == 1:
            return None
        start, _ = self.layout.vocab_part(cfg)
        return VocabShard(start, self.layout.vocab_rows(cfg), cfg.vocab_size, self.all_reduce, self.gather)

    def max_over_ranks(self, x: torch.Tensor) -> torch.Tensor:
        """The elementwise maximum of every rank's `x`, in place."""
        options = dist.AllreduceOptions()
        options.reduceOp = dist.ReduceOp.MAX
        self.group.allreduce([x], options).wait()
        return x

    def min_over_ranks(self, value: int) -> int:
        """The smallest of every rank's `value` (each rank's KV budget: the smallest wins)."""
        return value if self.layout.size == 1 else min_over(self.cpu_group, value)

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Rank 0's `tensor` into every rank's, over the CPU channel."""
        self.cpu_group.broadcast(tensor, 0).wait()


SINGLE = TensorParallel(WHOLE)


def check_collectives(device: torch.device) -> None:
    """Refuses a device whose ranks this build of torch has no collectives for."""
    backend = "NCCL" if device.type == "cuda" else "gloo"
    available = dist.is_available() and (dist.is_nccl_available() if backend == "NCCL" else dist.is_gloo_available())
    if not available:
        raise InvalidRequestError(
            f"tensor_parallel_size above 1 on {device.type} needs torch.distributed's {backend}, which this torch "
            "build lacks",
            param="tensor_parallel_size",
        )


def check_visible_gpus(size: int, visible: int) -> None:
    """Refuses more ranks than GPUs: each rank needs a device of its own."""
    if size > visible:
        raise InvalidRequestError(
            f"tensor_parallel_size {size} needs {size} GPUs; visible: {visible}", param="tensor_parallel_size"
        )


def join_group(rank: int, size: int, address: tuple[str, int], device: torch.device) -> TensorParallel:
    """Joins a tensor-parallel group of `size` ranks (one stage): see join_groups."""
    return join_groups(rank, size, 1, address, device, num_layers=0)[0]


def join_groups(
    rank: int, tensor_size: int, pipeline_size: int, address: tuple[str, int], device: torch.device, num_layers: int
) -> tuple[TensorParallel, PipelineParallel | None]:
    """Joins the engine's groups (rank 0 serves the rendezvous at `address`, the others reach it):
    the tensor-parallel group of this rank's stage and, with more than one stage, the group of
    every rank that the stages pass their activations over. Ranks are numbered stage by stage:
    rank = stage x tensor_size + index in the stage. The groups are made directly, not as
    torch.distributed's default group, so that one process may hold several engines in its life."""
    host, port = address
    world = tensor_size * pipeline_size
    store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=_TIMEOUT)
    stage, index = divmod(rank, tensor_size)
    tensor = SINGLE
    if tensor_size > 1:
        group, cpu_group = _groups(store, f"stage{stage}", index, tensor_size, device)
        tensor = TensorParallel(ShardLayout(index, tensor_size), group, cpu_group)
    pipeline = None
    if pipeline_size > 1:
        group, cpu_group = _groups(store, "pipeline", rank, world, device)
        stages = split_layers(num_layers, pipeline_size)
        pipeline = PipelineParallel(stages[stage], index, tensor_size, group, cpu_group)
    return tensor, pipeline


def _groups(store: Any, name: str, rank: int, size: int, device: torch.device) -> tuple[Any, Any]:
    """A group for the device's collectives (NCCL between GPUs) and its gloo twin for the CPU's."""
    cpu_group = dist.ProcessGroupGloo(dist.PrefixStore(f"{name}/cpu", store), rank, size, _TIMEOUT)
    if device.type != "cuda":
        return cpu_group, cpu_group
    return dist.ProcessGroupNCCL(dist.PrefixStore(f"{name}/device", store), rank, size), cpu_group


def free_port() -> int:
    """A TCP port free on loopback now, for the group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
