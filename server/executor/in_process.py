"""InProcessExecutor: one worker in the executor's own process (vLLM's `uni` backend), the default
with one rank: nothing to send anywhere, so a step costs no copy. It runs the same calls as the
multi-process executor, each on the worker as it is."""

from __future__ import annotations

from typing import Any

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.executor import Executor
from argosy.server.executor.worker_calls import WorkerCall, dispatch
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.worker import Worker


class InProcessExecutor(Executor):
    def __init__(self, config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos: tuple[int, ...]):
        self.worker = Worker(config, model, limits, eos)

    def call(self, call: WorkerCall) -> Any:
        return dispatch(self.worker, call)
