"""The figures of a simulated run: latency percentiles over the requests served, the share
within the objectives, errors, what the fleet cost in replica-seconds and how it scaled."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from argosy.simulator.requests import SimRequest


@dataclass(frozen=True)
class Objectives:
    ttft_seconds: float  # a request's time to its first token
    itl_seconds: float  # the mean time between its tokens


@dataclass(frozen=True)
class Summary:
    requests: int
    slo_attainment: float  # requests within both objectives (an error is not), of all requests
    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    itl_p99: float
    errors: int
    replica_seconds: float
    scale_events: int
    max_replicas: int
    output_tokens_per_second: float
    duration: float

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarise(
    requests: list[SimRequest],
    objectives: Objectives,
    replica_seconds: float,
    scale_events: int,
    max_replicas: int,
    duration: float,
) -> Summary:
    served = [r for r in requests if r.error is None and r.first_token is not None]
    ttfts = np.array([r.ttft for r in served]) if served else np.zeros(1)
    gaps = np.concatenate([np.zeros(0), *(np.asarray(r.gaps) for r in served)])
    if gaps.size == 0:
        gaps = np.zeros(1)
    within = sum(
        1
        for r in served
        if r.ttft <= objectives.ttft_seconds and (not r.gaps or sum(r.gaps) / len(r.gaps) <= objectives.itl_seconds)
    )
    return Summary(
        requests=len(requests),
        slo_attainment=within / len(requests) if requests else 1.0,
        ttft_p50=float(np.quantile(ttfts, 0.5)),
        ttft_p99=float(np.quantile(ttfts, 0.99)),
        itl_p50=float(np.quantile(gaps, 0.5)),
        itl_p99=float(np.quantile(gaps, 0.99)),
        errors=sum(1 for r in requests if r.error is not None),
        replica_seconds=replica_seconds,
        scale_events=scale_events,
        max_replicas=max_replicas,
        output_tokens_per_second=sum(r.tokens for r in served) / duration if duration else 0.0,
        duration=duration,
    )
