"""KEDA's operation of a ScaledObject, as its documentation describes it: every `pollingInterval`
it reads each trigger; a trigger is active above its `activationThreshold`; at 0 replicas an
active trigger scales the target to max(minReplicaCount, 1) at once, and with minReplicaCount 0
the target goes back to 0 once no trigger has been active for `cooldownPeriod`. Between 1 and
maxReplicaCount the HPA KEDA creates scales it (min max(minReplicaCount, 1)), each trigger an
external metric with its threshold as the AverageValue target, and the ScaledObject's
`advanced.horizontalPodAutoscalerConfig.behavior` as its behavior.

The ScaledObject is the operator's own manifest (operator/scaledobject.py): the simulator scales
with exactly the triggers and behavior a cluster would get."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from argosy.simulator.hpa import Behavior, HorizontalPodAutoscaler

DEFAULT_COOLDOWN_SECONDS = 300
DEFAULT_POLLING_SECONDS = 30


@dataclass(frozen=True)
class Trigger:
    name: str
    query: str
    threshold: float
    activation_threshold: float


class ScaledObjectController:
    def __init__(self, scaled_object: dict[str, Any]):
        spec = scaled_object["spec"]
        self.min_replicas = spec.get("minReplicaCount", 0)
        self.max_replicas = spec.get("maxReplicaCount", 100)
        self.polling_seconds = spec.get("pollingInterval", DEFAULT_POLLING_SECONDS)
        self.cooldown_seconds = spec.get("cooldownPeriod", DEFAULT_COOLDOWN_SECONDS)
        self.triggers = [
            Trigger(
                t.get("name", t["type"]),
                t["metadata"]["query"],
                float(t["metadata"]["threshold"]),
                float(t["metadata"].get("activationThreshold", 0)),
            )
            for t in spec["triggers"]
        ]
        hpa_config = spec.get("advanced", {}).get("horizontalPodAutoscalerConfig", {})
        self.hpa = HorizontalPodAutoscaler(
            max(self.min_replicas, 1), self.max_replicas, Behavior.from_manifest(hpa_config.get("behavior"))
        )
        self.last_active: float | None = None

    def poll(self, now: float, current: int, read: Callable[[str], float]) -> int:
        """KEDA's own loop: activation from 0 and the cooldown back to 0."""
        active = any(read(t.query) > t.activation_threshold for t in self.triggers)
        if active:
            self.last_active = now
        if current == 0 and active:
            return max(self.min_replicas, 1)
        if current > 0 and not active and self.min_replicas == 0:
            since = self.last_active if self.last_active is not None else -float("inf")
            if now - since >= self.cooldown_seconds:
                return 0
        return current

    def sync_hpa(self, now: float, current: int, read: Callable[[str], float]) -> int:
        """One sync of the HPA (every 15 s in a cluster), reading the triggers through KEDA."""
        if current == 0:
            return 0
        return self.hpa.reconcile(now, current, [(read(t.query), t.threshold) for t in self.triggers])
