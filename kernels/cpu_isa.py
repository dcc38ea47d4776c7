"""The instruction-set levels the CPU kernels are built for, and the one this process uses. Each
level is a build of every kernel with that level's compiler flags (what it lacks falls back to
portable code, which the compiler vectorises for the level): `portable` runs on any CPU,
`avx2` on x86 with AVX2 and FMA, `avx512` adds AVX-512 (F, BW, VL, DQ), `avx512_bf16` the
bfloat16 pair products. The highest level the CPU reports is used, unless ARGOSY_CPU_ISA names
a lower one (for testing every variant on one machine); a higher one than the CPU has is refused."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

from argosy.kernels.cpu_build import LEVELS, levels_for

ISA_ENV = "ARGOSY_CPU_ISA"
# The CPU flags (as /proc/cpuinfo names them) each level's code may use: each level's and the ones below.
_AVX2 = frozenset({"avx2", "fma", "f16c"})
_AVX512 = _AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
_NEEDS = {"portable": frozenset(), "avx2": _AVX2, "avx512": _AVX512, "avx512_bf16": _AVX512 | {"avx512_bf16"}}


class CpuIsaError(ValueError):
    """ARGOSY_CPU_ISA names no level, or one this CPU cannot run."""


def supported_levels(cpu_flags: frozenset[str], machine: str) -> list[str]:
    """The levels a CPU with these flags runs, lowest first (x86 levels only on x86)."""
    return [level for level in levels_for(machine) if _NEEDS[level] <= cpu_flags]


def chosen_level(forced: str | None, supported: list[str]) -> str:
    """The highest supported level, or the one `forced` names (ARGOSY_CPU_ISA)."""
    if not forced:
        return supported[-1]
    if forced not in LEVELS:
        raise CpuIsaError(f"{ISA_ENV}={forced!r} names no instruction-set level: one of {', '.join(LEVELS)}")
    if forced not in supported:
        raise CpuIsaError(
            f"{ISA_ENV}={forced!r} is beyond this CPU, which runs {', '.join(supported)} "
            f"(it lacks {', '.join(sorted(_NEEDS[forced] - _NEEDS[supported[-1]]))})"
        )
    return forced


@functools.cache
def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags, as Linux reports them (none elsewhere: portable code only)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def machine_levels() -> list[str]:
    return supported_levels(cpu_flags(), platform.machine())


def current_level() -> str:
    """The level this process's kernels run at."""
    return chosen_level(os.environ.get(ISA_ENV), machine_levels())
