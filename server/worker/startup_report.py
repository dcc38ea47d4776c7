"""What the engine settled on at start-up, and how long each phase took: one log line an
operator can read to see which path a pod runs (backend, graphs, quantization) and where
its memory went."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from argosy.server.models.tensor_reader import ReadStats

_MIB = 1 << 20


@dataclass
class StartupReport:
    device: str
    backend: str
    quantization: str | None
    graph_sizes: list[int]
    kv_blocks: int  # the sequences' blocks
    weight_bytes: int
    kv_cache_bytes: int  # all of the cache tensor, the null block included
    seconds: dict[str, float] = field(default_factory=dict)  # phase -> wall time, in order
    kernel_variants: int | None = None  # Triton kernel variants compiled (or, interpreted, keyed) by the warm-up
    checkpoint_read: ReadStats = field(default_factory=ReadStats)  # in the load phase
    stages: list[str] = field(default_factory=list)  # with pipeline parallelism, what each stage holds
    dtype: str = ""  # the weights' and activations' (with "auto": what suits the device)
    cpu_kernels: str | None = None  # on a CPU: the instruction-set level of the kernels, or "none" (PyTorch paths)

    def line(self) -> str:
        graphs = f"{len(self.graph_sizes)} sizes {_ranges(self.graph_sizes)}" if self.graph_sizes else "off"
        phases = ", ".join(f"{name} {secs:.2f}s{self._rate(name)}" for name, secs in self.seconds.items())
        warmed = "" if self.kernel_variants is None else f" ({self.kernel_variants} kernel variants warmed)"
        stages = f", pipeline of {len(self.stages)} stages ({'; '.join(self.stages)})" if self.stages else ""
        kernels = "" if self.cpu_kernels is None else f" (kernels {self.cpu_kernels})"
        return (
            f"engine ready on {self.device}{kernels}{stages}, dtype {self.dtype}: "
            f"attention backend {self.backend}{warmed}, cuda graphs {graphs}, "
            f"quantization {self.quantization or 'none'}, weights {self.weight_bytes / _MIB:.1f} MiB, "
            f"KV cache {self.kv_blocks} blocks ({self.kv_cache_bytes / _MIB:.1f} MiB); {phases}"
        )

    def _rate(self, phase: str) -> str:
        read = self.checkpoint_read
        if phase != "load" or not read.bytes or read.seconds <= 0:
            return ""
        gigabytes = read.bytes / 1e9
        return f" (checkpoint {gigabytes:.2f} GB read in {read.seconds:.2f}s, {gigabytes / read.seconds:.2f} GB/s)"


def tensor_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's saved state: its weights (quantized or not) and their scales."""
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _ranges(sizes: list[int]) -> str:
    return "[" + ", ".join(map(str, sizes)) + "]" if len(sizes) <= 6 else f"[{sizes[0]}, {sizes[1]}, ..., {sizes[-1]}]"


class PhaseClock:
    """Wall time of start-up phases, each from the end of the one before."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.seconds[phase] = now - self._last
        self._last = now
