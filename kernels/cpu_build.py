"""How the CPU kernels are built, one build per instruction-set level: the sources, the levels
and each level's compiler flags. Plain Python and torch only: setup.py reads this file before the
package is installed, to build every level at install (see cpu_kernels.py for the builds made on
first use instead)."""

from __future__ import annotations

import hashlib
from pathlib import Path

LEVELS = ("portable", "avx2", "avx512", "avx512_bf16")  # lowest first; all but portable are x86's
_AVX2 = ["-mavx2", "-mfma", "-mf16c"]
_AVX512 = [*_AVX2, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq"]
COMPILER_FLAGS = {"portable": [], "avx2": _AVX2, "avx512": _AVX512, "avx512_bf16": [*_AVX512, "-mavx512bf16"]}
HERE = Path(__file__).parent
SOURCES = [
    HERE / f"cpu_{name}.cpp"
    for name in (
        "attention",
        "chunk_attention",
        "argmax",
        "bitmask",
        "elementwise",
        "linear",
        "linear_int8",
        "kv_cache",
        "lora",
        "decoder",
    )
] + [HERE / "cpu_bindings.cpp"]
HEADERS = sorted(HERE.glob("cpu_*.h"))
LINK_FLAGS = ["-fopenmp"]


def levels_for(machine: str) -> list[str]:
    """The levels built for a machine architecture (every x86 level on x86, whatever its CPU runs)."""
    return list(LEVELS) if machine.lower() in ("x86_64", "amd64") else ["portable"]


def sources_digest() -> str:
    """What names a build: the sources' and headers' contents (PyTorch rebuilds when a listed
    source changes, not when a header does)."""
    return hashlib.sha256(b"".join(path.read_bytes() for path in [*SOURCES, *HEADERS])).hexdigest()[:12]


def build_flags(level: str, torch_version: str) -> list[str]:
    """The compiler's flags for a level's build. The sources' digest and torch's version go into
    the module: a build made at install is used only while both still hold."""
    # OpenMP as ATen's own parallel_for uses it (without it the loop runs on one thread);
    # libgomp.so.1 resolves to the copy torch has already loaded.
    # Unquoted (the module stringizes them): builds on first use hand the flags to a shell unquoted.
    made_from = [f"-DARGOSY_SOURCES_DIGEST={sources_digest()}", f"-DARGOSY_TORCH_VERSION={torch_version}"]
    return ["-O3", *COMPILER_FLAGS[level], "-ffast-math", "-fopenmp", *made_from]
