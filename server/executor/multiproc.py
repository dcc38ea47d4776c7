"""MultiprocExecutor: every rank's worker in a process of its own, rank 0 included (vLLM's
`--distributed-executor-backend mp`; tensor and pipeline parallelism always run this way). Each
call goes to every rank at once through one shared-memory MessageQueue; each rank answers on its
own pipe, and the driver's answer (the first rank of the last pipeline stage, which samples) is
the call's result. While it waits the executor watches every rank's process:
a rank that exits, at start-up or later, ends the call at once naming the rank (the others are
stopped, so that none is left in a collective), and so does an error from any rank but rank 0
with more than one (the group's collectives can no longer meet)."""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import sys
import weakref
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

import torch

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.executor import Executor, StepHandle
from argosy.server.executor.message_queue import MessageQueue
from argosy.server.executor.plan import StepPlan, StepResult
from argosy.server.executor.worker_calls import Execute, Shutdown, WorkerCall, encode, read_reply
from argosy.server.executor.worker_process import HELLO, WorkerSpec, worker_main
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import check_collectives, check_visible_gpus, free_port
from argosy.server.parallel.layout import check_tensor_parallel
from argosy.server.parallel.stages import check_pipeline_parallel
from argosy.server.worker.device import resolve_device

log = logging.getLogger("argosy.engine")


SHUTDOWN_WAIT_S = 5


class RankDiedError(RuntimeError):
    pass


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos: tuple[int, ...]):
        tensor, pipeline = config.tensor_parallel_size, config.pipeline_parallel_size
        size = self.size = config.ranks
        self.driver = (pipeline - 1) * tensor
        device = resolve_device(config)
        if tensor > 1:
            check_tensor_parallel(model, tensor)
        if pipeline > 1:
            check_pipeline_parallel(model, pipeline)
        if size > 1:
            check_collectives(device)
        if device.type == "cuda":
            check_visible_gpus(size, torch.cuda.device_count())
        self.queue = MessageQueue(size)
        address = ("127.0.0.1", free_port())
        spec = WorkerSpec(config, model, limits, eos, tensor, pipeline, address, self.queue.handle())
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads
        self.procs: list[BaseProcess] = []
        self.replies: list[Connection] = []
        for rank in range(size):
            receiver, sender = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(rank, spec, sender), name=f"argosy-rank-{rank}", daemon=True)
            proc.start()
            sender.close()
            self.procs.append(proc)
            self.replies.append(receiver)
        # Stopped with the executor, or at exit before multiprocessing's own exit hook, whose
        # one-by-one ends would let the last ranks see their peers vanish mid-collective.
        weakref.finalize(self, _stop, self.procs, self.queue)
        atexit.register(_stop, self.procs, self.queue)
        self.said_hello = [False] * size  # until it does, a rank has run none of the project's code
        for rank in range(size):
            self.said_hello[rank] = self._wait_for(rank) == HELLO

    def shutdown(self) -> None:
        """Tells every rank to stop and waits a moment for them (what is left is killed)."""
        if all(proc.is_alive() for proc in self.procs):
            self.queue.put(encode(Shutdown()))
            for proc in self.procs:
                proc.join(SHUTDOWN_WAIT_S)
        _stop(self.procs, self.queue)

    def execute_async(self, plan: StepPlan) -> StepHandle:
        """The plan goes to every rank now; the handle reads their answers (in the order the
        steps were started)."""
        call = Execute(plan)
        self.queue.put(encode(call), self._check_alive)
        return Answers(self, call)

    def call(self, call: WorkerCall) -> Any:
        """Sends `call` to every rank and returns the driver's result once every rank has answered."""
        self.queue.put(encode(call), self._check_alive)
        return self.answers(call)

    def answers(self, call: WorkerCall) -> Any:
        """The driver's result of `call`, once every rank has answered it (rank 0's error, if it failed)."""
        results = {}
        for rank in range(self.size):
            reply = self._wait_for(rank)
            try:
                results[rank] = read_reply(call, reply)
            except Exception as exc:
                if rank == 0 or self.size == 1:
                    self._drain(rank + 1)
                    raise
                _stop(self.procs, self.queue)
                raise RankDiedError(f"{self._name(rank)} failed: {type(exc).__name__}: {exc}") from exc
        return results[self.driver]

    def _drain(self, first: int) -> None:
        """The other ranks' answers to a call rank 0 failed, read so that the next call's are next."""
        for rank in range(first, self.size):
            self._wait_for(rank)

    def _wait_for(self, rank: int) -> bytes:
        """Rank `rank`'s next answer, watching every rank's process while it comes."""
        conn = self.replies[rank]
        while not conn.poll():
            wait([conn, *(proc.sentinel for proc in self.procs)])
            self._check_alive()
        try:
            return conn.recv_bytes()
        except (EOFError, OSError):
            self._check_alive()
            raise

    def _check_alive(self) -> None:
        """Raises if a rank has exited, the others stopped first: no rank is left running."""
        for rank, proc in enumerate(self.procs):
            if not proc.is_alive():
                started = self.said_hello[rank] or _said_hello(self.replies[rank])
                _stop(self.procs, self.queue)
                why = "" if started else _never_ran()
                raise RankDiedError(f"{self._name(rank)} exited (code {proc.exitcode}){why}")

    def _name(self, rank: int) -> str:
        return f"rank {rank}" if self.size > 1 else "the worker process"


class Answers:
    """A started step's handle: its answers, read when asked for."""

    def __init__(self, executor: MultiprocExecutor, call: WorkerCall):
        self.executor, self.call = executor, call

    def result(self) -> StepResult:
        return self.executor.answers(self.call)


def _said_hello(conn: Connection) -> bool:
    """Whether a rank that exited had said hello first (an answer left unread)."""
    try:
        return conn.poll() and conn.recv_bytes() == HELLO
    except (EOFError, OSError):
        return False


def _never_ran() -> str:
    """Why a rank may have ended before its first word, where the cause is a usual one."""
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) is None and getattr(main, "__file__", None):
        return (
            f" before it ran: each rank is a spawned process that imports {main.__file__} again, so the code that "
            'starts the engine there must sit under `if __name__ == "__main__":`'
        )
    return " before it ran (its error is in the log above)"


def _stop(procs: list[BaseProcess], queue: MessageQueue) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)
    queue.close()
