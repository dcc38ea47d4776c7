"""Deployment: the simulated pods of one service and its replica count (the scale subresource's
`spec.replicas`, which the HPA reads and sets). Scaled down, it deletes pods as a ReplicaSet
does: pods still starting (not ready) before ready ones, newer before older."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from argosy.simulator.replica import Replica


class Deployment:
    def __init__(self, env: simpy.Environment, make_replica: Callable[[str, bool], Replica], replicas: int):
        """`make_replica(name, started)`: a pod, `started` for those running before the clock starts."""
        self.env = env
        self._make = make_replica
        self._names = 0
        self.pods: list[Replica] = []  # live: starting, ready or draining
        self.ended: list[Replica] = []  # gone, kept for the replica-seconds
        self.replicas = 0
        self.scale_events: list[tuple[float, int, int]] = []  # (time, from, to)
        self.scale(replicas, started=True)
        self.scale_events.clear()  # the first replicas are no scaling

    def scale(self, replicas: int, started: bool = False) -> None:
        if replicas != self.replicas:
            self.scale_events.append((self.env.now, self.replicas, replicas))
        self.replicas = replicas
        self._reap()
        current = [p for p in self.pods if p.state in ("starting", "ready")]
        for _ in range(replicas - len(current)):
            self._names += 1
            self.pods.append(self._make(f"pod-{self._names}", started))
        # Deleted first: not ready before ready, then the newest.
        victims = sorted(current, key=lambda p: (p.ready, -p.created))
        for pod in victims[: max(0, len(current) - replicas)]:
            pod.delete()

    def ready_pods(self) -> list[Replica]:
        return [p for p in self.pods if p.ready]

    def _reap(self) -> None:
        gone = [p for p in self.pods if p.state == "gone"]
        self.ended += gone
        self.pods = [p for p in self.pods if p.state != "gone"]

    def replica_seconds(self, until: float) -> float:
        """Pod time paid for: from creation to the end of the drain (or `until`)."""
        self._reap()
        return sum((p.ended if p.ended is not None else until) - p.created for p in self.pods + self.ended)
