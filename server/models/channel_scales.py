"""The scale of each output channel of a weight quantized per channel (FP8, int8): the row's
largest magnitude over the format's largest value."""

from __future__ import annotations

from collections.abc import Callable

import torch


def channel_scales(
    weight: torch.Tensor, largest: float, row_max: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> torch.Tensor:
    """[out, in] float32 weight -> float32 scale [out]. `row_max`: a slice of the rows' columns on
    each tensor-parallel rank, whose maxima it combines, so that the scales, and the quantized
    weights, are those of the whole row."""
    amax = weight.abs().amax(dim=1)
    if row_max is not None:
        amax = row_max(amax)
    # A zero row would give scale 0 and 0/0 = NaN; any positive scale encodes it exactly.
    return torch.where(amax > 0, amax / largest, torch.ones_like(amax))
