"""Triton, imported the one way every kernel module uses: on a machine without CUDA the kernels
run in Triton's interpreter (on CPU tensors), which is how CI proves them against their PyTorch
references. The interpreter is chosen when kernels are decorated, so this runs first."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

__all__ = ["INTERPRETED", "tl", "triton"]
