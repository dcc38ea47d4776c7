"""Prometheus, as the autoscaler sees it: every scrape interval it reads each ready or draining
pod's gauges (a starting pod serves no /metrics yet), and a query sees the last scrape. Queries are
the operator's own trigger queries, of the form `AGG(metric{...}) or AGG(other{...}) or vector(N)`
with AGG one of sum, avg, max: the first term with a series present answers, as PromQL's `or`
does. The label matchers select this service's pods, the only pods here. The Endpoint Picker's
flow-control queue (the operator's held-requests trigger) is the router's requests held while no
replica is ready, read at the scrape as the rest."""

from __future__ import annotations

import re
from collections.abc import Callable

import simpy

from argosy.operator.scaledobject import HELD_METRICS
from argosy.server.interface import KV_USAGE_METRIC, RUNNING_METRIC, WAITING_METRIC
from argosy.simulator.deployment import Deployment

GAUGES = {WAITING_METRIC: "waiting", RUNNING_METRIC: "running", KV_USAGE_METRIC: "kv_usage"}
_TERM = re.compile(r"^(sum|avg|max)\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{.*\})?\s*\)$")
_VECTOR = re.compile(r"^vector\(\s*([0-9.eE+-]+)\s*\)$")
AGGREGATES = {"sum": sum, "avg": lambda values: sum(values) / len(values), "max": max}


class Prometheus:
    def __init__(self, env: simpy.Environment, deployment: Deployment, held: Callable[[], int], scrape_seconds: float):
        self.deployment = deployment
        self.held = held
        self.scrape_seconds = scrape_seconds
        self.scraped: list[dict[str, float]] = []  # one per pod, at the last scrape
        self.scraped_held = 0
        env.process(self._scrape(env))

    def _scrape(self, env: simpy.Environment):
        while True:
            self.scraped = [pod.gauges() for pod in self.deployment.pods if pod.state in ("ready", "draining")]
            self.scraped_held = self.held()
            yield env.timeout(self.scrape_seconds)

    def query(self, query: str) -> float:
        for term in (t.strip() for t in query.split(" or ")):
            if vector := _VECTOR.match(term):
                return float(vector.group(1))
            match = _TERM.match(term)
            if match is None:
                raise ValueError(f"the simulator cannot evaluate {term!r} (of {query!r})")
            aggregate, metric = AGGREGATES[match.group(1)], match.group(2)
            if metric == HELD_METRICS[0]:
                return float(self.scraped_held)
            if metric in GAUGES and self.scraped:
                return float(aggregate([pod[GAUGES[metric]] for pod in self.scraped]))
        return 0.0
