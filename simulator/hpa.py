"""The Kubernetes HorizontalPodAutoscaler's algorithm, as documented and as its controller
computes it (pkg/controller/podautoscaler): for an external metric with an AverageValue target
(what KEDA's Prometheus triggers are), the proposal is ceil(total / target) unless the usage
ratio total / (target x current replicas) is within the tolerance of 1 (0.1 by default); the
largest proposal of all metrics wins; then `behavior` applies: the stabilisation window (the
lowest recent recommendation for a scale-up, the highest for a scale-down), and the policies that
bound the change per period, counted from the replicas at the start of each period (the scale
events within it subtracted), selected by `selectPolicy` (Max, Min, Disabled). Replicas below
minReplicas or above maxReplicas are brought within them first, without metrics. At 0 replicas
with minReplicas above 0 the HPA does nothing (KEDA owns 0 <-> 1).

Pure: the caller passes the clock, so the simulator and the tests drive it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_TOLERANCE = 0.1
DOWNSCALE_STABILISATION_SECONDS = 300  # --horizontal-pod-autoscaler-downscale-stabilization


@dataclass(frozen=True)
class ScalingPolicy:
    type: Literal["Pods", "Percent"]
    value: int
    period_seconds: int


@dataclass(frozen=True)
class ScalingRules:
    stabilization_window_seconds: int
    policies: tuple[ScalingPolicy, ...]
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"

    @classmethod
    def from_manifest(cls, rules: dict[str, Any] | None, default: ScalingRules) -> ScalingRules:
        """A `behavior.scaleUp` or `.scaleDown` object; what it leaves out is the default's."""
        if rules is None:
            return default
        policies = rules.get("policies")
        return cls(
            rules.get("stabilizationWindowSeconds", default.stabilization_window_seconds),
            default.policies
            if policies is None
            else tuple(ScalingPolicy(p["type"], int(p["value"]), int(p["periodSeconds"])) for p in policies),
            rules.get("selectPolicy", default.select_policy),
        )

    @property
    def longest_period(self) -> int:
        return max((p.period_seconds for p in self.policies), default=0)


# The documented defaults: up by 100% or 4 pods per 15 s, whichever is more, at once; down by up to
# 100% per 15 s, after 300 s of lower recommendations.
DEFAULT_SCALE_UP = ScalingRules(0, (ScalingPolicy("Percent", 100, 15), ScalingPolicy("Pods", 4, 15)))
DEFAULT_SCALE_DOWN = ScalingRules(DOWNSCALE_STABILISATION_SECONDS, (ScalingPolicy("Percent", 100, 15),))


@dataclass(frozen=True)
class Behavior:
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN

    @classmethod
    def from_manifest(cls, behavior: dict[str, Any] | None) -> Behavior:
        behavior = behavior or {}
        return cls(
            ScalingRules.from_manifest(behavior.get("scaleUp"), DEFAULT_SCALE_UP),
            ScalingRules.from_manifest(behavior.get("scaleDown"), DEFAULT_SCALE_DOWN),
        )


def average_value_replicas(total: float, target: float, current: int, tolerance: float = DEFAULT_TOLERANCE) -> int:
    """An external metric's proposal with an AverageValue target (`total` over all pods)."""
    if current == 0:
        return math.ceil(total / target)
    ratio = total / (target * current)
    return current if abs(1.0 - ratio) <= tolerance else math.ceil(total / target)


@dataclass
class HorizontalPodAutoscaler:
    min_replicas: int
    max_replicas: int
    behavior: Behavior = field(default_factory=Behavior)
    tolerance: float = DEFAULT_TOLERANCE
    recommendations: list[tuple[float, int]] = field(default_factory=list)  # (time, replicas)
    scale_up_events: list[tuple[float, int]] = field(default_factory=list)  # (time, pods added)
    scale_down_events: list[tuple[float, int]] = field(default_factory=list)  # (time, pods removed)

    def reconcile(self, now: float, current: int, metrics: list[tuple[float, float]]) -> int:
        """The replicas to run after one sync, given each metric's (total, target per pod)."""
        if current == 0 and self.min_replicas != 0:
            return 0  # scaling disabled: KEDA activates the target
        if current > self.max_replicas:
            desired = self.max_replicas
        elif current < self.min_replicas:
            desired = self.min_replicas
        else:
            proposal = max(average_value_replicas(total, target, current, self.tolerance) for total, target in metrics)
            desired = self._normalise(now, current, proposal)
        if desired != current:
            self._record_scale(now, current, desired)
        return desired

    def settled_at(self, now: float, replicas: int) -> None:
        """As an HPA that has recommended `replicas` until `now` (a fleet that stood there a while)."""
        self.recommendations.append((now, replicas))

    def _normalise(self, now: float, current: int, proposal: int) -> int:
        stabilised = self._stabilise(now, current, proposal)
        return self._bound_rate(now, current, stabilised)

    def _stabilise(self, now: float, current: int, proposal: int) -> int:
        up, down = self.behavior.scale_up, self.behavior.scale_down
        if proposal >= current:
            window, better = up.stabilization_window_seconds, min
        else:
            window, better = down.stabilization_window_seconds, max
        recommendation = proposal
        for when, recommended in self.recommendations:
            if when > now - window:
                recommendation = better(recommended, recommendation)
        keep = max(up.stabilization_window_seconds, down.stabilization_window_seconds)
        self.recommendations = [(t, r) for t, r in self.recommendations if t >= now - keep]
        self.recommendations.append((now, proposal))
        return recommendation

    def _bound_rate(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = max(_scale_up_limit(now, current, self.scale_up_events, self.behavior.scale_up), current)
            return min(desired, limit, self.max_replicas)
        if desired < current:
            limit = min(_scale_down_limit(now, current, self.scale_down_events, self.behavior.scale_down), current)
            return max(desired, limit, self.min_replicas)
        return desired

    def _record_scale(self, now: float, before: int, after: int) -> None:
        if after > before:
            horizon = self.behavior.scale_up.longest_period
            self.scale_up_events = [(t, n) for t, n in self.scale_up_events if t >= now - horizon]
            self.scale_up_events.append((now, after - before))
        else:
            horizon = self.behavior.scale_down.longest_period
            self.scale_down_events = [(t, n) for t, n in self.scale_down_events if t >= now - horizon]
            self.scale_down_events.append((now, before - after))


def _changed_within(now: float, period: int, events: list[tuple[float, int]]) -> int:
    return sum(n for t, n in events if t > now - period)


def _scale_up_limit(now: float, current: int, events: list[tuple[float, int]], rules: ScalingRules) -> int:
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = current - _changed_within(now, policy.period_seconds, events)
        if policy.type == "Pods":
            proposals.append(start + policy.value)
        else:  # rounded up, or a small target could never grow
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    return (min if rules.select_policy == "Min" else max)(proposals)


def _scale_down_limit(now: float, current: int, events: list[tuple[float, int]], rules: ScalingRules) -> int:
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = current + _changed_within(now, policy.period_seconds, events)
        if policy.type == "Pods":
            proposals.append(start - policy.value)
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    # Scaling down, the larger change is the lower count.
    return (max if rules.select_policy == "Min" else min)(proposals)
