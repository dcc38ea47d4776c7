"""ProfiledExecutor: the device side of a simulated replica. It runs no model: each step's
sampled rows get a token (requests ignore EOS and stop at their trace's length), and the step
takes the time the profile gives its shape, which the replica's clock then advances by."""

from __future__ import annotations

from typing import Any

from argosy.server.executor.executor import Executor
from argosy.server.executor.plan import DeviceReady, StepPlan, StepResult
from argosy.server.executor.worker_calls import Execute, Start, WorkerCall
from argosy.server.profile.engine_profile import EngineProfile
from argosy.server.profile.step_shape import StepShape

TOKEN = 0  # what every step samples


class ProfiledExecutor(Executor):
    def __init__(self, profile: EngineProfile):
        self.profile = profile
        self.last_seconds = 0.0  # of the step run last

    def call(self, call: WorkerCall) -> Any:
        if isinstance(call, Start):
            return DeviceReady(self.profile.settings.num_blocks, f"simulated on the profile of {self.profile.machine}")
        if isinstance(call, Execute):
            return self._execute(call.plan)
        raise NotImplementedError(f"a simulated replica does not {type(call).__name__}")

    def _execute(self, plan: StepPlan) -> StepResult:
        self.last_seconds = self.profile.step_seconds(StepShape.of(plan))
        rows = len(plan.samples)
        return StepResult([[TOKEN] for _ in range(rows)], [None] * rows, [None] * rows)
