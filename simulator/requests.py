"""SimRequest: one trace request's life in the simulation, and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.simulator.trace import TraceRequest


@dataclass
class SimRequest:
    request_id: str
    trace: TraceRequest
    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    finished: float | None = None
    error: str | None = None  # rejected, timed out, or cut off by a pod's shutdown
    gaps: list[float] = field(default_factory=list)  # between consecutive tokens

    def tokens_at(self, now: float, count: int) -> None:
        if self.first_token is None:
            self.first_token = now
            count -= 1  # the first token has no gap; the others of its step arrive with it
        elif self.last_token is not None:
            self.gaps.append(now - self.last_token)
            count -= 1
        self.gaps.extend([0.0] * count)
        self.tokens = len(self.gaps) + 1
        self.last_token = now

    @property
    def done(self) -> bool:
        return self.finished is not None or self.error is not None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival
