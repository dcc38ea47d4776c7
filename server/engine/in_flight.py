"""InFlightStep: a step the executor runs, from its launch to its landing. Launched, its plan has
gone to the device side and its handle gives the result; landed, its result is taken in (tokens
appended, stops checked, forks made). Synchronously a step lands as soon as it is launched; with
async scheduling the next step is planned and launched before it lands, so the host's planning
and output processing overlap the device's step. Nothing in the next step depends on this one's
tokens: a sequence this step samples waits for its token (it is not scheduled again until then)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from argosy.server.engine.scheduler_output import SchedulerOutput
from argosy.server.engine.sequence import Sequence
from argosy.server.executor.plan import StepPlan

if TYPE_CHECKING:
    from argosy.server.engine.parallel_sampling import Fork
    from argosy.server.executor.executor import StepHandle


@dataclass
class InFlightStep:
    scheduled: SchedulerOutput
    plan: StepPlan
    completing: list[Sequence]  # the sequences it samples, in the plan's order
    forks: dict[int, Fork]
    handle: StepHandle
