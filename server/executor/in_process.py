"""InProcessExecutor: one worker in the executor's own process (vLLM's `uni` backend), the default
with one rank: nothing to send anywhere, so a step costs no copy. It runs the same calls as the
multi-process executor, each on the worker as it is. With async scheduling a step runs in a
thread of its own (the forward pass lets go of the GIL), one step after the other, while the
engine plans the next."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.executor import Executor, StepHandle
from argosy.server.executor.plan import StepPlan
from argosy.server.executor.worker_calls import Execute, WorkerCall, dispatch
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.worker import Worker


class InProcessExecutor(Executor):
    def __init__(self, config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos: tuple[int, ...]):
        self.worker = Worker(config, model, limits, eos)
        self._steps = ThreadPoolExecutor(1, thread_name_prefix="step") if config.async_scheduling else None

    def execute_async(self, plan: StepPlan) -> StepHandle:
        if self._steps is None:
            return super().execute_async(plan)
        return self._steps.submit(self.call, Execute(plan))

    def call(self, call: WorkerCall) -> Any:
        return dispatch(self.worker, call)
