"""Timeline: the fleet sampled at a fixed interval (replicas asked for, ready and starting, the
requests waiting and running, and the TTFT of the requests that got their first token in each
interval), for the plots."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import simpy

from argosy.simulator.deployment import Deployment
from argosy.simulator.requests import SimRequest


@dataclass
class Timeline:
    time: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)  # spec.replicas
    ready: list[int] = field(default_factory=list)
    starting: list[int] = field(default_factory=list)
    asleep: list[int] = field(default_factory=list)  # the warm pool's
    waiting: list[float] = field(default_factory=list)  # in the pods' queues and held by the router
    running: list[float] = field(default_factory=list)
    ttft_p50: list[float] = field(default_factory=list)  # NaN where no first token came
    ttft_p99: list[float] = field(default_factory=list)

    def sample(self, now: float, deployment: Deployment, held: int, firsts: list[float]) -> None:
        pods = deployment.pods
        gauges = [p.gauges() for p in pods if p.scraped]
        self.time.append(now)
        self.replicas.append(deployment.replicas)
        self.ready.append(sum(p.ready for p in pods))
        self.starting.append(sum(p.state == "starting" for p in pods))
        self.asleep.append(sum(p.state == "asleep" for p in pods))
        self.waiting.append(sum(g["waiting"] for g in gauges) + held)
        self.running.append(sum(g["running"] for g in gauges))
        self.ttft_p50.append(float(np.quantile(firsts, 0.5)) if firsts else float("nan"))
        self.ttft_p99.append(float(np.quantile(firsts, 0.99)) if firsts else float("nan"))


def record(
    env: simpy.Environment, timeline: Timeline, deployment: Deployment, held, requests: list[SimRequest], every: float
):
    """A process sampling the fleet every `every` seconds; `held()` counts the router's held requests."""
    seen = 0  # requests are in arrival order; their first tokens are collected as they come
    pending: list[SimRequest] = []
    while True:
        yield env.timeout(every)
        while seen < len(requests) and requests[seen].arrival <= env.now:
            pending.append(requests[seen])
            seen += 1
        firsts = [r.ttft for r in pending if r.first_token is not None]
        pending = [r for r in pending if r.first_token is None and r.error is None]
        timeline.sample(env.now, deployment, held(), firsts)
