"""Router: which ready replica a request goes to, or none yet (the request is held and offered
again). `round_robin` in turn (the vLLM router's round_robin, and about what a Kubernetes
Service's proxy does); `least_requests` to the replica with the fewest requests waiting and
running (the load signal of the vLLM router's and the Endpoint Picker's load-aware scorers);
`flow_control` as the Endpoint Picker with flow control: to the least loaded replica that is not
saturated (fewer than 5 requests waiting and KV cache under 80% full, llm-d's saturation
detector's defaults), else held in the gateway's queue, where the held-requests trigger sees it.
Every policy holds requests while no replica is ready."""

from __future__ import annotations

import itertools
from typing import Literal

from argosy.simulator.replica import Replica

RouterPolicy = Literal["round_robin", "least_requests", "flow_control"]
POLICIES: tuple[RouterPolicy, ...] = ("round_robin", "least_requests", "flow_control")
SATURATED_WAITING = 5
SATURATED_KV_USAGE = 0.8


class Router:
    def __init__(self, policy: RouterPolicy):
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}: one of {', '.join(POLICIES)}")
        self.policy = policy
        self._turn = itertools.count()

    def pick(self, replicas: list[Replica]) -> Replica | None:
        ready = [r for r in replicas if r.ready]
        if self.policy == "flow_control":
            ready = [r for r in ready if not _saturated(r)]
        if not ready:
            return None
        if self.policy == "round_robin":
            return ready[next(self._turn) % len(ready)]
        return min(ready, key=lambda r: sum(r.core.num_requests()))


def _saturated(replica: Replica) -> bool:
    gauges = replica.gauges()
    return gauges["waiting"] >= SATURATED_WAITING or gauges["kv_usage"] >= SATURATED_KV_USAGE
