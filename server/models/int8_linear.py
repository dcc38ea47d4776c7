"""Weight-only int8 (`--quantization int8`): each linear layer's weight in int8 with one float32
scale per output channel (symmetric, the row's largest magnitude at 127), quantized at load.

On CPUs the product is Argosy's own kernel (kernels/cpu_linear_int8.cpp, a variant at every
instruction-set level): a decode step reads every weight once, so half the bytes of bfloat16 is
what moves batch-1 decode toward the bandwidth bound. Activations stay in the model dtype (no
per-token activation scales, as W8A8 formats have): the weights are the only rounding added. The
LM head is quantized too, as llama.cpp's Q8_0 quantizes its output layer; the embeddings, a
lookup, stay as loaded. Elsewhere (no kernels, float32 models, a shape outside the kernel's
units, GPUs) the same function in float32 over the int8 weight: correct, not fast."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from argosy.kernels import cpu_kernels
from argosy.server.models.channel_scales import channel_scales
from argosy.server.models.linear import Linear

INT8_MAX = 127  # symmetric: -128 is never used, so -q is always representable


def quantize_int8(
    weight: torch.Tensor, row_max: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (int8 weight [out, in], float32 scale [out]), rounded to nearest."""
    w = weight.float()
    scale = channel_scales(w, INT8_MAX, row_max)
    return torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def int8_kernel_fits(device: torch.device, dtype: torch.dtype, out_features: int) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and out_features % 16 == 0 and cpu_kernels.kernels_built()


class Int8Linear(Linear):
    """A Linear whose loaded weight becomes int8 with a float32 scale per output channel (in the
    kernel's layout where it runs); the bias stays in the model dtype."""

    in_kernel = False  # decided per layer once its weight is quantized

    def process_weights(self) -> None:
        dtype = self.weight.dtype
        q, scale = quantize_int8(self.weight.detach(), self.row_max)
        self.in_kernel = int8_kernel_fits(q.device, dtype, self.out_features)
        del self.weight  # the loaded layout goes as its quantized copy comes
        self.register_buffer("int8_weight", cpu_kernels.int8_weight(q) if self.in_kernel else q)
        self.register_buffer("weight_scale", scale)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        if not self.in_kernel:
            out = nn.functional.linear(x.float(), self.int8_weight.float()) * self.weight_scale
            return (out if self.bias is None else out + self.bias.float()).to(x.dtype)
        return self.rows_product(
            x,
            lambda rows: cpu_kernels.int8_linear(
                rows, self.int8_weight, self.weight_scale, self.bias, self.out_features
            ),
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, int8_kernel={self.in_kernel}"
