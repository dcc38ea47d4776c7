"""RankProcesses: ranks 1..N-1 of a tensor-parallel group, each in a process of its own (rank 0
is the engine core's own executor). A rank process builds its share of the model exactly as
rank 0 builds its own (the start-up's forward passes run in step, their all-reduces meeting),
then runs every plan rank 0 sends until told to stop. It dies with its parent (the kernel
kills it when the core's process goes, kill -9 included), and rank 0 checks before each step
that every rank still runs, so a dead rank fails the step instead of hanging it."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import multiprocessing
import os
import signal
import socket
import weakref

import torch

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import join_group

_PR_SET_PDEATHSIG = 1


class RankDiedError(RuntimeError):
    pass


class RankProcesses:
    def __init__(self, config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos: tuple[int, ...]):
        size = config.tensor_parallel_size
        self.address = ("127.0.0.1", free_port())  # rank 0 serves the rendezvous there
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads
        self.procs = [
            ctx.Process(
                target=rank_main,
                args=(rank, size, self.address, config, model, limits, eos),
                name=f"argosy-rank-{rank}",
                daemon=True,
            )
            for rank in range(1, size)
        ]
        for proc in self.procs:
            proc.start()
        # Stopped with the executor, or at exit before multiprocessing's own exit hook, whose
        # one-by-one ends would let the last ranks see their peers vanish mid-collective.
        weakref.finalize(self, _stop, self.procs)
        atexit.register(_stop, self.procs)

    def check_alive(self) -> None:
        """Raises if a rank has exited, the others stopped first: no rank is left running."""
        for rank, proc in enumerate(self.procs, start=1):
            if not proc.is_alive():
                _stop(self.procs)
                raise RankDiedError(f"tensor-parallel rank {rank} exited (code {proc.exitcode})")


def _stop(procs: list[multiprocessing.Process]) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)


def rank_main(
    rank: int,
    size: int,
    address: tuple[str, int],
    config: EngineConfig,
    model: ModelConfig,
    limits: EngineLimits,
    eos: tuple[int, ...],
) -> None:
    _die_with_parent()
    from argosy.server.worker.executor import InProcessExecutor, rank_device

    device = rank_device(config, rank)
    if device.type == "cpu":
        share_cpu_threads(size)
    shards = join_group(rank, size, address, device)
    executor = InProcessExecutor(config, model, limits, eos, shards)
    executor.start()
    try:
        executor.follow()
    except RuntimeError as exc:
        if "Connection closed by peer" in str(exc):  # another rank went first: rank 0 reports it
            return
        raise


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def share_cpu_threads(size: int) -> None:
    """On a CPU host the ranks share its cores: each takes its part, none oversubscribes them."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
