"""Deployment: the simulated pods of one service and its replica count (the scale subresource's
`spec.replicas`, which the HPA reads and sets). Scaled down, it deletes pods as a ReplicaSet
does: pods still starting (not ready) before ready ones, newer before older.

With a warm pool of W, W more pods are kept asleep: a scale-up wakes them first (serving in the
wake time) and starts pods to refill the pool; a scale-down puts drained pods back to sleep while
the pool has room. Asleep pods hold their accelerators: they count in the replica-seconds."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from argosy.simulator.replica import Replica


class Deployment:
    def __init__(
        self,
        env: simpy.Environment,
        make_replica: Callable[[str, bool], Replica],
        replicas: int,
        warm_pool: int = 0,
        wake_seconds: float = 1.0,
    ):
        """`make_replica(name, started)`: a pod, `started` for those running before the clock starts."""
        self.env = env
        self._make = make_replica
        self.warm_pool = warm_pool
        self.wake_seconds = wake_seconds
        self._names = 0
        self.pods: list[Replica] = []  # not gone: starting, ready, draining, asleep or waking
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
        current = [p for p in self.pods if p.serving]
        pool = [p for p in self.pods if p.pooled]
        missing = replicas - len(current)
        for pod in sorted(pool, key=lambda p: p.state != "asleep")[: max(0, missing)]:  # the asleep first
            pod.wake(self.wake_seconds)
            pool.remove(pod)
            missing -= 1
        for _ in range(missing):
            self._new(started)
        # Deleted first: not ready before ready, then the newest.
        victims = sorted(current, key=lambda p: (p.ready, -p.created))
        for pod in victims[: max(0, len(current) - replicas)]:
            to_pool = len(pool) < self.warm_pool
            pod.delete(to_pool)
            if to_pool:
                pool.append(pod)
        for _ in range(self.warm_pool - len(pool)):
            self._new(started).delete(to_pool=True)

    def _new(self, started: bool) -> Replica:
        self._names += 1
        pod = self._make(f"pod-{self._names}", started)
        self.pods.append(pod)
        return pod

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
