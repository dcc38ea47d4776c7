"""The machine a benchmark or a profile ran on, for its table or its file: the CPU's model, core
count and the instruction sets that decide the kernels' speed."""

from __future__ import annotations

import os
from pathlib import Path

FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16")


def cpu_line() -> str:
    model, flags = "unknown CPU", set()
    info = Path("/proc/cpuinfo")
    if info.exists():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    present = [flag for flag in FLAGS if flag in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(present) or 'no AVX2'}"
