"""Choosing Triton's interpreter where there is no CUDA. Triton reads TRITON_INTERPRET when it is
first imported (its own library functions are decorated then), so the processes that may run
Triton kernels call this before anything, a checkpoint conversion through transformers say,
imports triton. Nothing here imports triton."""

from __future__ import annotations

import os

import torch


def use_interpreter_without_cuda() -> bool:
    """Selects the interpreter when CUDA is absent; True when the interpreter is selected."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return os.environ.get("TRITON_INTERPRET") == "1"
