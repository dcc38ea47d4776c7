"""Online FP8 weight quantization, as vLLM's `quantization="fp8"` does it.

The decoder layers' linear layers are `Fp8Linear`s (the LinearFactory's choice): once loaded,
each weight is quantized to float8 e4m3 with one float32 scale per output channel. That halves the bytes of the weights
that dominate the model, so the KV cache gets them. The embedding and the LM head stay in the
model dtype, as in vLLM: they are lookups or run once per sampled token, and the logits are
where rounding would show most.

The product runs in FP8 on GPUs with FP8 tensor cores (compute capability 8.9 and up), with
activations quantized per token on the fly; elsewhere the weight is dequantized for each
call, which keeps the memory saving and computes the same function (the CPU twin)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from argosy.server.models.channel_scales import channel_scales
from argosy.server.models.linear import Linear

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# vLLM's floor for dynamic activation scales: an all-zero token row must not divide by zero.
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def quantize_weight(
    weight: torch.Tensor, row_max: Callable[[torch.Tensor], torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] weight -> (e4m3 weight [out, in], float32 scale [out]), the scales those of whole
    rows across tensor-parallel ranks (`row_max`, channel_scales)."""
    w = weight.float()
    scale = channel_scales(w, FP8_MAX, row_max)
    # amax/scale can round to just above 448, which e4m3fn (no infinities) would turn into NaN.
    q = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale


def fp8_gemm_supported(device: torch.device) -> bool:
    """FP8 tensor cores: NVIDIA Ada (8.9) and Hopper (9.0) and later. ROCm's MI300 wants the
    e4m3fnuz variant, which we do not produce, so it takes the dequantized path."""
    if device.type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


SCALE_ROWS = 256  # the row tile of the row-wise scaled matmul kernel


def rows_scale_padded(scale: torch.Tensor) -> torch.Tensor:
    """The per-row activation scale [M, 1] as a view into a buffer of a multiple of SCALE_ROWS
    rows (the padding 1.0): torch's row-wise FP8 kernel reads the scales a whole row tile at a
    time, past M when M is not a multiple of 256, in releases before its own fix (pytorch issue
    133334: an illegal memory access). Padded here, it reads only memory of its own."""
    rows = scale.shape[0]
    padded = -(-rows // SCALE_ROWS) * SCALE_ROWS
    if padded == rows:
        return scale
    buffer = torch.ones(padded, 1, dtype=scale.dtype, device=scale.device)
    buffer[:rows] = scale
    return buffer[:rows]


class Fp8Linear(Linear):
    """A Linear whose loaded weight becomes e4m3 [out, in] with a float32 scale per output
    channel; the bias stays in the model dtype."""

    use_fp8_gemm = False  # decided per layer once its weight is quantized

    def process_weights(self) -> None:
        dtype = self.weight.dtype
        q, scale = quantize_weight(self.weight.detach(), self.row_max)
        # The loaded weight goes as its quantized copy comes, so the peak stays one layer above.
        self.weight = nn.Parameter(q, requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        # Decided once, per layer: _scaled_mm wants both weight dims divisible by 16, and older
        # torch releases give rowwise scaling bf16 output only, so fp16/fp32 models dequantize.
        self.use_fp8_gemm = (
            fp8_gemm_supported(q.device)
            and dtype == torch.bfloat16
            and self.in_features % 16 == 0
            and self.out_features % 16 == 0
        )

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        return self.weight.to(dtype) * self.weight_scale[:, None].to(dtype)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        if not self.use_fp8_gemm:
            return nn.functional.linear(x, self.dequantized_weight(x.dtype), self.bias)
        x2 = x.reshape(-1, self.in_features)
        x_scale = rows_scale_padded((x2.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE))
        # mat1 must be row-major; mat2 column-major, which .t() of the [out, in] weight is.
        x_fp8 = (x2.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(FP8).contiguous()
        w_scale = self.weight_scale.view(1, -1)  # [1, out], contiguous as rowwise scaling wants
        out = torch._scaled_mm(x_fp8, self.weight.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fp8_gemm={self.use_fp8_gemm}"


def decoder_linears(model: nn.Module) -> list[Linear]:
    """The linear layers of the decoder layers: what FP8 quantizes."""
    return [
        m
        for layer in model.layers
        for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
    ]


def linear_weight_bytes(model: nn.Module) -> int:
    """Bytes of the decoder layers' linear weights, with their scales when quantized; biases
    (model dtype either way) are not counted."""
    total = 0
    for linear in decoder_linears(model):
        tensors = [linear.weight] + ([linear.weight_scale] if isinstance(linear, Fp8Linear) else [])
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total
