"""Triton, imported the one way every kernel module uses: on a machine without CUDA the kernels
run in Triton's interpreter (on CPU tensors), which is how CI proves them against their PyTorch
references."""

from __future__ import annotations

import os
import sys

import torch

from argosy.kernels.interpreter import use_interpreter_without_cuda

# TRITON_INTERPRET=0, set on purpose, compiles without a device (ahead-of-time checks) and launches nothing.
if "triton" in sys.modules and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") not in ("0", "1"):
    raise RuntimeError(
        "Triton was imported before Argosy could select its interpreter, and there is no CUDA device; "
        "set TRITON_INTERPRET=1 in the environment, or use --attention-backend torch"
    )
INTERPRETED = use_interpreter_without_cuda()

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

_ROUND_BY_HAND = tl.constexpr(INTERPRETED)


@triton.jit
def rounded(x, DTYPE: tl.constexpr):
    """float32 x in DTYPE, rounded to nearest even as a GPU rounds. The interpreter truncates to
    bfloat16 instead, and truncation biases the residual stream toward zero, layer after layer,
    until a bfloat16 model's greedy answer changes: there the rounding is done on the bits."""
    if _ROUND_BY_HAND and DTYPE == tl.bfloat16:  # noqa: SIM300 (the constexpr compares itself)
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return x.to(DTYPE)


__all__ = ["INTERPRETED", "rounded", "tl", "triton"]
