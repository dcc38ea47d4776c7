"""A worker in a process of its own: it says hello (so that the executor tells a rank that never
ran from one that failed), joins its tensor-parallel group and its pipeline, builds its Worker,
then runs each call read from its node's message queue and answers on its own pipe, until told
to stop. It dies with its parent (the kernel kills it when the executor's process goes, kill -9
included)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.message_queue import MessageQueue
from argosy.server.executor.worker_calls import Shutdown, decode_call, run_call
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import SINGLE, join_groups

_PR_SET_PDEATHSIG = 1
HELLO = b"hello"


@dataclass(frozen=True)
class WorkerSpec:
    """What every rank is started with."""

    config: EngineConfig
    model: ModelConfig
    limits: EngineLimits
    eos_token_ids: tuple[int, ...]
    address: tuple[str, int]  # rank 0 serves the groups' rendezvous there
    queue: tuple[int, str, int]  # its node's MessageQueue.handle()


def worker_main(rank: int, index: int, spec: WorkerSpec, replies: Connection) -> None:
    """Rank `rank` of the engine, reader `index` of its node's queue."""
    _die_with_parent()
    replies.send_bytes(HELLO)
    from argosy.server.worker.worker import Worker, rank_device

    calls = MessageQueue(spec.queue[0], spec.queue[1], index, spec.queue[2])
    device = rank_device(spec.config, rank)
    config = spec.config
    if device.type == "cpu":
        share_cpu_threads(config.ranks_per_node)
    shards, pipeline = SINGLE, None
    if config.ranks > 1:
        sizes = config.tensor_parallel_size, config.pipeline_parallel_size
        shards, pipeline = join_groups(rank, *sizes, spec.address, device, spec.model.num_layers)
    worker = Worker(spec.config, spec.model, spec.limits, spec.eos_token_ids, shards, pipeline)
    try:
        while not isinstance(call := decode_call(calls.get()), Shutdown):
            replies.send_bytes(run_call(worker, call))
    except RuntimeError as exc:
        if "Connection closed by peer" in str(exc):  # another rank went first: the executor reports it
            return
        raise
    finally:
        calls.close()


def share_cpu_threads(size: int) -> None:
    """On a CPU host its `size` ranks share its cores: each takes its part, none oversubscribes them."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // size))


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
