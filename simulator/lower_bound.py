"""The perfect-knowledge lower bound of a fleet's replica-seconds: a fleet that knows each
minute's demand in advance and starts pods at once runs, each minute, just the replicas whose
capacity at the objectives covers that minute's output tokens (at least minReplicas). A
replica's capacity is what the queueing model says it generates within the ITL objective
(operator/objectives.py), so the bound and the policy measure capacity alike."""

from __future__ import annotations

import math

from argosy.simulator.trace import TraceRequest


def replicas_needed(
    trace: list[TraceRequest], tokens_per_second: float, min_replicas: int, window: float = 60.0
) -> list[int]:
    """The replicas each `window` of the trace needs: its output tokens at `tokens_per_second` a replica."""
    if not trace:
        return []
    windows = math.ceil((trace[-1].time + 1e-9) / window)
    demand = [0.0] * windows
    for request in trace:
        demand[min(int(request.time // window), windows - 1)] += request.output_tokens
    return [max(min_replicas, math.ceil(tokens / window / tokens_per_second)) for tokens in demand]


def lower_bound_replica_seconds(
    trace: list[TraceRequest], tokens_per_second: float, min_replicas: int, window: float = 60.0
) -> float:
    return sum(replicas_needed(trace, tokens_per_second, min_replicas, window)) * window
