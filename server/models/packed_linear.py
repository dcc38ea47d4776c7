"""PackedLinear: a linear layer for CPUs whose weight oneDNN reorders once, at load, into the
blocked layout its matrix products read; each product then skips that reordering. Exact (the
same products, the same results as `F.linear`) and faster where decode steps spend most of
their time: 2x at one row, 20-25% at 32, a few percent at prefill sizes (bfloat16, this CPU)."""

from __future__ import annotations

import torch

from argosy.server.models.linear import Linear


def packing_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """On CPUs whose oneDNN has reduced-precision products of this dtype: a CPU without them
    (AVX2 alone) refuses the reorder at load."""
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return dtype == torch.float16 and torch.ops.mkldnn._is_mkldnn_fp16_supported()


class PackedLinear(Linear):
    def process_weights(self) -> None:
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None)
        del self.weight  # the loaded layout goes; the reordered one is all that is kept
        self.register_buffer("packed_weight", packed)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the engine's flattened batch
            return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed_weight, self.bias, "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)
