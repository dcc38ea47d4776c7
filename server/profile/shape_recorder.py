"""ShapeRecorder: an executor that notes the shape of each step it runs, so that the profile can
time the engine's whole step (scheduling, planning, the device, the stop checks) and know what
the step was."""

from __future__ import annotations

from typing import Any

from argosy.server.executor.executor import Done, Executor, StepHandle
from argosy.server.executor.plan import StepPlan, StepResult
from argosy.server.executor.worker_calls import WorkerCall
from argosy.server.profile.step_shape import StepShape


class ShapeRecorder(Executor):
    def __init__(self, inner: Executor):
        self.inner = inner
        self.shapes: list[StepShape] = []  # of the steps run since the last take

    def execute(self, plan: StepPlan) -> StepResult:
        result = self.inner.execute(plan)
        if plan.chunks:
            self.shapes.append(StepShape.of(plan))
        return result

    def execute_async(self, plan: StepPlan) -> StepHandle:
        return Done(self.execute(plan))

    def take(self) -> list[StepShape]:
        shapes, self.shapes = self.shapes, []
        return shapes

    def call(self, call: WorkerCall) -> Any:
        return self.inner.call(call)

    def shutdown(self) -> None:
        self.inner.shutdown()
