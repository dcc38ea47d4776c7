"""PipelineStages: how pipeline parallelism splits a model's decoder layers into contiguous
stages, one per group of tensor-parallel ranks, as pure functions of the model's shape. The first
stage also embeds the tokens; the last also holds the final norm and the LM head, so the layers
that do not divide evenly go to the first stages, never to the last."""

from __future__ import annotations

from dataclasses import dataclass

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig

MAX_IMBALANCE = 1.5  # the most layers the largest stage may hold, as a multiple of the smallest's


@dataclass(frozen=True)
class PipelineStage:
    index: int  # 0 embeds the tokens; size - 1 computes the logits
    size: int  # stages in the pipeline
    start: int  # its decoder layers: [start, end)
    end: int

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1

    @property
    def num_layers(self) -> int:
        return self.end - self.start

    def describe(self) -> str:
        parts = ["embedding"] if self.first else []
        parts.append(f"layers {self.start}-{self.end - 1}")
        if self.last:
            parts.append("norm and LM head")
        return f"stage {self.index}: " + ", ".join(parts)


def split_layers(num_layers: int, size: int) -> list[PipelineStage]:
    """Every stage's layers: as even as they divide, the first stages taking one more."""
    base, extra = divmod(num_layers, size)
    stages, start = [], 0
    for index in range(size):
        count = base + (1 if index < extra else 0)
        stages.append(PipelineStage(index, size, start, start + count))
        start += count
    return stages


def check_pipeline_parallel(cfg: ModelConfig, size: int) -> None:
    """Refuses, with the numbers, stage counts the layers do not split into sensibly: more stages
    than layers, or stages so uneven that the largest holds over MAX_IMBALANCE times the smallest
    (a pipeline runs at its slowest stage's pace: the others would idle that much)."""
    layers = cfg.num_layers
    why = None
    if size > layers:
        why = f"exceeds the model's {layers} decoder layers: every stage needs at least one"
    else:
        counts = [stage.num_layers for stage in split_layers(layers, size)]
        if max(counts) > MAX_IMBALANCE * min(counts):
            dividing = [n for n in range(2, min(layers, 16) + 1) if layers % n == 0]
            why = (
                f"splits the model's {layers} decoder layers into stages of {max(counts)} and {min(counts)}, "
                f"the pipeline's pace set by the largest; sizes that divide them evenly: {dividing}"
            )
    if why is not None:
        raise InvalidRequestError(f"pipeline_parallel_size {size} {why}", param="pipeline_parallel_size")
