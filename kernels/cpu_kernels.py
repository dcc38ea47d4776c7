"""The CPU kernels (cpu_*.cpp: decode and chunk attention, greedy argmax, grammar masks, the bfloat16
elementwise ops and linear layers, KV-cache writes, the LoRA products), one build per
instruction-set level (cpu_isa.py), the one this CPU runs at chosen at start-up. Each level's
build is made when the package is installed (setup.py: `argosy.kernels._cpu_<level>`); where it
is missing, or was made from other sources or for another torch, it is compiled on first use
into a folder under TORCH_EXTENSIONS_DIR that its sources name. Where they cannot be built (no
C++ compiler), their callers take the pure-PyTorch paths, with one warning."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

from argosy.kernels import kv_cache_ops
from argosy.kernels.cpu_build import HEADERS, LINK_FLAGS, SOURCES, build_flags, sources_digest
from argosy.kernels.cpu_isa import current_level

log = logging.getLogger("argosy.kernels")
DISABLE_ENV = "ARGOSY_CPU_KERNELS"  # "0": always the PyTorch path


def build_directory(level: str) -> Path:
    from torch.utils.cpp_extension import get_default_build_root

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root()
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return Path(root) / f"argosy_cpu_kernels_{level}-{python}-torch{torch.__version__}-{sources_digest()}"


@contextlib.contextmanager
def exclusive_build(directory: Path) -> Iterator[None]:
    """Holds an flock on the build directory, which the kernel releases when its holder dies.
    PyTorch's own lock is a file that outlives a build killed midway, and every later load then
    waits for it forever; under the flock no other build of ours can be running, so such a file
    is stale and goes."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "argosy.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        (directory / "lock").unlink(missing_ok=True)
        yield


def sources_in(directory: Path) -> list[Path]:
    """The sources and headers copied into the build directory, which their contents name: ninja
    rebuilds whenever a source's path changes, so two checkouts (or installs) of the same sources
    would otherwise rebuild each other's kernels at every start."""
    copies = directory / "src"
    copies.mkdir(exist_ok=True)
    for path in [*SOURCES, *HEADERS]:
        copy = copies / path.name
        if not copy.is_file() or copy.read_bytes() != path.read_bytes():
            copy.write_bytes(path.read_bytes())
    return [copies / source.name for source in SOURCES]


def prebuilt(level: str) -> ModuleType | None:
    """The level's build made at install, if it was made from these sources for this torch."""
    try:
        module = importlib.import_module(f"argosy.kernels._cpu_{level}")
    except ImportError:
        return None
    if (module.sources_digest, module.torch_version) != (sources_digest(), torch.__version__):
        return None
    return module


@functools.cache
def kernels_at(level: str) -> ModuleType | None:
    """The kernels built for `level` (which this CPU must run); None where they cannot be built."""
    if (module := prebuilt(level)) is not None:
        return module
    from torch.utils.cpp_extension import load

    name = f"argosy_cpu_kernels_{level}"
    try:
        directory = build_directory(level)
        if not (directory / f"{name}.so").is_file():  # a first start here is otherwise silent
            log.info("compiling the CPU kernels for %s (once, about half a minute) into %s", level, directory)
        with exclusive_build(directory):
            sources = [str(source) for source in sources_in(directory)]
            flags = build_flags(level, torch.__version__)
            return load(name, sources, build_directory=str(directory), extra_cflags=flags, extra_ldflags=LINK_FLAGS)
    except Exception as exc:  # a missing compiler must not stop the engine
        log.warning("the CPU kernels could not be built (%s); the PyTorch paths run instead", exc)
        return None


@functools.cache
def cpu_kernels() -> ModuleType | None:
    """The kernels at this process's level (raises CpuIsaError for an ARGOSY_CPU_ISA it cannot run)."""
    if os.environ.get(DISABLE_ENV) == "0":
        return None
    return kernels_at(current_level())


NO_KERNELS = "none: PyTorch's paths"


def level_in_use() -> str:
    """What the start-up line says of the CPU kernels: their level, or that PyTorch's paths run."""
    return current_level() if cpu_kernels() is not None else NO_KERNELS


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


def paged_chunk_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_start: torch.Tensor,
    q_len: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    out: torch.Tensor,
) -> None:
    """Writes each chunk's rows of out (out: [tokens, heads, head_dim]): q_len[i] consecutive
    queries from q_start[i], attending causally to the seq_lens[i] keys of their sequence."""
    cpu_kernels().paged_chunk_attention(q, k_cache, v_cache, q_start, q_len, seq_lens, block_tables, scale, out)


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum (int64), for logits [rows, vocab] with contiguous rows."""
    return cpu_kernels().greedy_argmax(logits)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
    """Bans, in float32 logits [batch, vocab] with contiguous rows, each of `rows` the tokens its
    bitmask row (int32 words) leaves out."""
    cpu_kernels().apply_token_bitmask(logits, bitmask, torch.tensor(rows, dtype=torch.long))


def kernels_built() -> bool:
    """Whether the kernels are built: the pair and int8 products have a variant at every level."""
    return cpu_kernels() is not None


def pair_weight(weight: torch.Tensor) -> torch.Tensor:
    """A bfloat16 weight [out, in] (out a multiple of 16, in even) in the layout of `paired_linear`."""
    return cpu_kernels().pack_linear_bf16(weight)


def paired_linear(x: torch.Tensor, paired: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x [rows, in] W^T (+ bias) in bfloat16, each row summed alike however many rows there are."""
    return cpu_kernels().linear_bf16(x, paired, bias, out_features)


def int8_weight(q: torch.Tensor) -> torch.Tensor:
    """An int8 weight [out, in] (out a multiple of 16) in the layout of `int8_linear`."""
    return cpu_kernels().pack_linear_int8(q)


def int8_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """(x [rows, in] Q^T) * scale (+ bias) in bfloat16 over an int8 weight, each row summed alike
    however many rows there are."""
    return cpu_kernels().linear_int8(x, packed, scale, bias, out_features)


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """As kv_cache_ops.write_kv, which serves the layouts and dtypes this does not."""
    heads_contiguous = k.stride(2) == v.stride(2) == 1 and k.stride(1) == v.stride(1) == k.shape[2]
    if heads_contiguous and k.dtype == v.dtype == k_cache.dtype == v_cache.dtype:
        cpu_kernels().write_kv(k, v, k_cache, v_cache, slot_mapping)
    else:
        kv_cache_ops.write_kv(k, v, k_cache, v_cache, slot_mapping)
