"""The machine a benchmark or a profile ran on, for its table or its file: the CPU's model, core
count and the instruction sets that decide the kernels' speed."""

from __future__ import annotations

import os
from pathlib import Path

from argosy.kernels.cpu_isa import cpu_flags

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def cpu_line() -> str:
    model = "unknown CPU"
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
                break
    present = [flag for flag in FLAGS if flag in cpu_flags()]
    return f"{model}, {os.cpu_count()} cores, {' '.join(present) or 'no AVX2'}"
