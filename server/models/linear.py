"""Linear: the model's linear layers, in a weight format each: plain (as loaded, this class),
FP8 (fp8.py) or oneDNN-packed (packed_linear.py), as the LinearFactory picks. A layer's weight
is loaded as the checkpoint has it, then `process_weights` turns it into its format; `forward`
is the product in that format, then each addition attached with `add` adds its share into it
(LoRA adapters: any layer, any format)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

Role = Literal["qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head"]


class Linear(nn.Module):
    """x W^T + b with the weight [out, in] as loaded; subclasses keep it in another format."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.additions = nn.ModuleList()
        self.has_additions = False  # a plain flag: the hot path skips the module list's lookup
        # With tensor parallelism, for a layer split by its input columns: the maxima of each
        # output row over every rank's slice, for formats that scale rows by them (FP8).
        self.row_max: Callable[[torch.Tensor], torch.Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Linear's initialisation (nothing to do on the meta device, where models are built
        before their checkpoint fills them): a layer made on its own is usable."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_features) if self.in_features > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        """A layer of this format holding `weight` [out, in] (and `bias`), processed."""
        with torch.device("meta"):  # no initialisation of what the copy overwrites
            layer = cls(weight.shape[1], weight.shape[0], bias is not None)
        layer = layer.to(dtype=weight.dtype).to_empty(device=weight.device)
        with torch.no_grad():
            layer.weight.copy_(weight)
            if bias is not None:
                layer.bias.copy_(bias)
        layer.process_weights()
        return layer

    def process_weights(self) -> None:
        """Once the checkpoint is loaded: the weight into this layer's format."""

    @torch.no_grad()
    def reload(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        """New weights as a checkpoint holds them ([out, in]; loaded in the model's `dtype`), into
        this layer's format, in place: every tensor keeps its address (CUDA graphs replay on them)."""
        device = next(iter(self.state_dict(keep_vars=True).values())).device
        fresh = type(self).from_weight(weight.to(device, dtype), None if bias is None else bias.to(device, dtype))
        mine = dict(self.named_parameters(recurse=False)) | dict(self.named_buffers(recurse=False))
        for name, tensor in [*fresh.named_parameters(recurse=False), *fresh.named_buffers(recurse=False)]:
            mine[name].copy_(tensor)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def rows_product(self, x: torch.Tensor, product: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """`product` of x's rows ([rows, in], each row contiguous), in x's leading shape: for the
        CPU kernels, which take two-dimensional x."""
        rows = x.reshape(-1, self.in_features)
        if rows.stride(1) != 1:
            rows = rows.contiguous()
        out = product(rows)
        return out if x.dim() == 2 else out.view(*x.shape[:-1], self.out_features)

    def add(self, addition: nn.Module) -> None:
        """From now on `addition(x, out)` adds to every output `out`, in place."""
        self.additions.append(addition)
        self.has_additions = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.product(x)
        if self.has_additions:
            for addition in self.additions:
                out = addition(x, out)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@torch.no_grad()
def process_weights(model: nn.Module) -> None:
    """After loading: every Linear of the model into its format, one at a time (each layer's
    loaded weight goes as its successor is made, so the peak stays one layer above the model)."""
    for module in model.modules():
        if isinstance(module, Linear):
            module.process_weights()
