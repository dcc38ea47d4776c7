"""Router: which ready replica a request goes to. `round_robin` in turn (the vLLM router's
round_robin, and about what a Kubernetes Service's proxy does); `least_requests` to the replica
with the fewest requests waiting and running (the load signal of the vLLM router's and the
Endpoint Picker's load-aware policies). With no replica ready the router holds the request until
one is."""

from __future__ import annotations

import itertools
from typing import Literal

from argosy.simulator.replica import Replica

RouterPolicy = Literal["round_robin", "least_requests"]
POLICIES: tuple[RouterPolicy, ...] = ("round_robin", "least_requests")


class Router:
    def __init__(self, policy: RouterPolicy):
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}: one of {', '.join(POLICIES)}")
        self.policy = policy
        self._turn = itertools.count()

    def pick(self, replicas: list[Replica]) -> Replica | None:
        ready = [r for r in replicas if r.ready]
        if not ready:
            return None
        if self.policy == "round_robin":
            return ready[next(self._turn) % len(ready)]
        return min(ready, key=lambda r: sum(r.core.num_requests()))
