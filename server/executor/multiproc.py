"""MultiprocExecutor: every rank's worker in a process of its own, rank 0 included (vLLM's
`--distributed-executor-backend mp`; tensor and pipeline parallelism always run this way). Each
call goes to every rank at once: to this node's through one shared-memory MessageQueue
(local_ranks.py), to the other nodes' of a model served across nodes through their links
(node_link.py). Each rank answers on its own channel, and the driver's answer (the first rank of
the last pipeline stage, which samples) is the call's result. While it waits the executor watches
every rank: a rank that exits, at start-up or later, here or on another node, ends the call at
once naming the rank (the others are stopped, so that none is left in a collective), and so does
an error from any rank but rank 0 with more than one (the group's collectives can no longer
meet)."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import torch

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.executor import Executor, StepHandle
from argosy.server.executor.local_ranks import LocalRanks, RankDiedError
from argosy.server.executor.node_link import RemoteNodes, link_port
from argosy.server.executor.plan import StepPlan, StepResult
from argosy.server.executor.worker_calls import Execute, Shutdown, WorkerCall, encode, read_reply
from argosy.server.executor.worker_process import WorkerSpec
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import check_collectives, check_visible_gpus, free_port
from argosy.server.parallel.layout import check_tensor_parallel
from argosy.server.parallel.stages import check_pipeline_parallel
from argosy.server.worker.device import resolve_device

log = logging.getLogger("argosy.engine")
NODES_TIMEOUT_S = 600.0  # for the other nodes to connect: their pods may start minutes apart

__all__ = ["MultiprocExecutor", "RankDiedError"]


class MultiprocExecutor(Executor):
    def __init__(self, config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos: tuple[int, ...]):
        tensor, pipeline = config.tensor_parallel_size, config.pipeline_parallel_size
        size = self.size = config.ranks
        self.driver = (pipeline - 1) * tensor
        self.per_node = config.ranks_per_node
        device = resolve_device(config)
        if tensor > 1:
            check_tensor_parallel(model, tensor)
        if pipeline > 1:
            check_pipeline_parallel(model, pipeline)
        if size > 1:
            check_collectives(device)
        if device.type == "cuda":
            check_visible_gpus(self.per_node, torch.cuda.device_count())
        address = ("127.0.0.1", free_port()) if config.nnodes == 1 else (config.master_addr, config.master_port)
        spec = WorkerSpec(config, model, limits, eos, address, (0, "", 0))
        self.local = LocalRanks(spec, 0, self.per_node)
        self.remote = None
        if config.nnodes > 1:
            port = link_port(config.master_port)
            log.info("waiting for %d more nodes at port %d", config.nnodes - 1, port)
            encoded = msgspec.msgpack.encode(spec)
            self.remote = RemoteNodes(port, config.nnodes, self.per_node, encoded, NODES_TIMEOUT_S, self._check_alive)

    @property
    def procs(self):
        """This node's ranks' processes."""
        return self.local.procs

    def shutdown(self) -> None:
        """Tells every rank to stop and waits a moment for them (what is left is killed)."""
        if self.remote is not None:
            self.remote.broadcast(encode(Shutdown()))
        self.local.shutdown()
        if self.remote is not None:
            self.remote.close()

    def execute_async(self, plan: StepPlan) -> StepHandle:
        """The plan goes to every rank now; the handle reads their answers (in the order the
        steps were started)."""
        call = Execute(plan)
        self._send(call)
        return Answers(self, call)

    def call(self, call: WorkerCall) -> Any:
        """Sends `call` to every rank and returns the driver's result once every rank has answered."""
        self._send(call)
        return self.answers(call)

    def _send(self, call: WorkerCall) -> None:
        message = encode(call)
        if self.remote is not None:
            self.remote.broadcast(message)
        self.local.put(message, self._check_remote)

    def answers(self, call: WorkerCall) -> Any:
        """The driver's result of `call`, once every rank has answered it (rank 0's error, if it failed)."""
        results = {}
        for rank in range(self.size):
            reply = self._answer(rank)
            try:
                results[rank] = read_reply(call, reply)
            except Exception as exc:
                if rank == 0 or self.size == 1:
                    self._drain(rank + 1)
                    raise
                self._stop()
                raise RankDiedError(f"{self.local.name(rank)} failed: {type(exc).__name__}: {exc}") from exc
        return results[self.driver]

    def _answer(self, rank: int) -> bytes:
        if rank < self.per_node:
            return self.local.wait_for(rank, self._check_remote)
        return self.remote.answer(rank, self._check_alive)

    def _drain(self, first: int) -> None:
        """The other ranks' answers to a call rank 0 failed, read so that the next call's are next."""
        for rank in range(first, self.size):
            self._answer(rank)

    def _check_alive(self) -> None:
        """Raises if a rank has exited, here or on another node: no rank is left running."""
        try:
            self.local.check_alive()
        except RankDiedError:
            self._stop()
            raise
        self._check_remote()

    def _check_remote(self) -> None:
        if self.remote is not None and self.remote.failure is not None:
            self._stop()
            raise RankDiedError(self.remote.failure)

    def _stop(self) -> None:
        self.local.stop()
        if self.remote is not None:
            self.remote.close()


class Answers:
    """A started step's handle: its answers, read when asked for."""

    def __init__(self, executor: MultiprocExecutor, call: WorkerCall):
        self.executor, self.call = executor, call

    def result(self) -> StepResult:
        return self.executor.answers(self.call)
