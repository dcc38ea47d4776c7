"""EngineProfile: the engine's step time on one machine, fitted from timed steps, with the engine
settings it was measured under (KV blocks, limits), in a JSON file that `argosy simulate` and the
operator read.

The step time is linear in the shape's features (StepShape): a fixed cost per step, a cost per
prompt token and per thousand attention pairs, per decoded sequence and per KV position it reads,
per sampled row. The fit weighs each step by its inverse duration, so that short decode steps fit
as closely, relatively, as long prefills; a feature whose coefficient would come out negative is
dropped and the rest refitted (a cost is never negative)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from argosy.server.profile.step_shape import FEATURES, StepShape


class EngineSettings(BaseModel):
    model: str  # the checkpoint folder profiled
    startup: str  # the engine's start-up line: device, dtype, kernels, memory
    block_size: int
    num_blocks: int  # KV-cache blocks the engine had
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool


class FitQuality(BaseModel):
    steps: int
    median_relative_error: float
    p90_relative_error: float


class EngineProfile(BaseModel):
    version: int = 1
    machine: str  # the CPU model and flags, or the GPU, and the threads
    settings: EngineSettings
    coefficients: dict[str, float]  # seconds per unit of each StepShape feature
    fit: FitQuality
    samples: list[list[float]] = Field(default_factory=list)  # the features then the seconds of each step timed

    def step_seconds(self, shape: StepShape) -> float:
        return sum(self.coefficients.get(name, 0.0) * value for name, value in zip(FEATURES, shape.features()))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.model_dump_json(indent=1) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> EngineProfile:
        return cls.model_validate(json.loads(Path(path).read_text()))


def fit_coefficients(samples: list[tuple[StepShape, float]]) -> tuple[dict[str, float], FitQuality]:
    """Non-negative, relatively weighted least squares of step seconds on the shape features."""
    x = np.array([shape.features() for shape, _ in samples], dtype=np.float64)
    y = np.array([seconds for _, seconds in samples], dtype=np.float64)
    weights = 1.0 / y
    kept = [i for i in range(x.shape[1]) if np.any(x[:, i])]
    while True:
        solution, *_ = np.linalg.lstsq(x[:, kept] * weights[:, None], y * weights, rcond=None)
        if (solution >= 0).all():
            break
        kept.pop(int(np.argmin(solution)))
    coefficients = dict.fromkeys(FEATURES, 0.0)
    for index, value in zip(kept, solution):
        coefficients[FEATURES[index]] = float(value)
    predicted = x @ np.array([coefficients[name] for name in FEATURES])
    errors = np.abs(predicted - y) / y
    quality = FitQuality(
        steps=len(samples),
        median_relative_error=float(np.median(errors)),
        p90_relative_error=float(np.quantile(errors, 0.9)),
    )
    return coefficients, quality
