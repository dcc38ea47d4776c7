"""The CPU decode-attention kernel (cpu_attention.cpp), compiled on first use for this
machine and cached by PyTorch (TORCH_EXTENSIONS_DIR). Where it cannot be built (no C++
compiler), decodes take the pure-PyTorch path of paged_attention.py, with one warning."""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger("argosy.kernels")
SOURCE = Path(__file__).with_name("cpu_attention.cpp")
DISABLE_ENV = "ARGOSY_CPU_KERNELS"  # "0": always the PyTorch path


@functools.cache
def cpu_kernels() -> ModuleType | None:
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    from torch.utils.cpp_extension import load

    try:
        return load(
            "argosy_cpu_attention",
            [str(SOURCE)],
            # OpenMP as ATen's own parallel_for uses it (without it the loop runs on one thread);
            # libgomp.so.1 resolves to the copy torch has already loaded.
            extra_cflags=["-O3", "-march=native", "-ffast-math", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # a missing compiler must not stop the engine
        log.warning("the CPU attention kernel could not be built (%s); decodes use the PyTorch path", exc)
        return None


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_index: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Writes out[q_index] (out: [tokens, heads, head_dim]) for one query token per sequence."""
    cpu_kernels().paged_decode_attention(q, k_cache, v_cache, q_index, block_tables, seq_lens, scale, out)
