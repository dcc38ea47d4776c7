"""Triton, imported the one way every kernel module uses: on a machine without CUDA the kernels
run in Triton's interpreter (on CPU tensors), which is how CI proves them against their PyTorch
references. Triton reads TRITON_INTERPRET when it is first imported (its own library functions
are decorated then), so this must run before anything else imports it."""

from __future__ import annotations

import os
import sys

import torch

if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    if "triton" in sys.modules:
        raise RuntimeError(
            "Triton was imported before Argosy could select its interpreter, and there is no CUDA device; "
            "set TRITON_INTERPRET=1 in the environment, or use --attention-backend torch"
        )
    os.environ["TRITON_INTERPRET"] = "1"

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

__all__ = ["INTERPRETED", "tl", "triton"]
