"""PairedLinear: a bfloat16 linear layer for CPUs, whose weight is laid out at load in pairs of
inputs for Argosy's own product kernel (kernels/cpu_linear.cpp, a variant at every
instruction-set level). Decode steps read every weight for a handful of rows, so they are bound
by memory bandwidth: on AVX512-BF16 the kernel reads the weights about 1.3x faster than oneDNN at
one to sixteen rows, and as fast at prefill sizes. Each row's sum runs in one fixed order whatever
the rows beside it, so a token's result does not depend on the batch it was computed in
(oneDNN's does, from 2 rows on)."""

from __future__ import annotations

import torch

from argosy.kernels import cpu_kernels
from argosy.server.models.linear import Linear


def pairing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and cpu_kernels.kernels_built()


def pairing_fits(in_features: int, out_features: int) -> bool:
    """The layout's units: 16 outputs, each over pairs of inputs."""
    return out_features % 16 == 0 and in_features % 2 == 0


class PairedLinear(Linear):
    def process_weights(self) -> None:
        paired = cpu_kernels.pair_weight(self.weight.detach())
        del self.weight  # the loaded layout goes; the paired one is all that is kept
        self.register_buffer("paired_weight", paired)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return self.rows_product(
            x, lambda rows: cpu_kernels.paired_linear(rows, self.paired_weight, self.bias, self.out_features)
        )
