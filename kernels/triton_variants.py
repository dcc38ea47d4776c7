"""The compiled variants of the Triton kernels the engine launches. Triton compiles a kernel once
per variant: its compile-time constants and launch options, and what it specialises its other
arguments on (an integer's width, its equality to 1 and divisibility by 16; a pointer's dtype
and 16-byte alignment). A variant first met while serving compiles on the engine's thread, for
seconds in which no request advances. So every value that changes from step to step is left
unspecialised, the engine launches each variant it can produce during start-up
(ModelRunner.warm_up), and it watches the count afterwards.

On CUDA the count is read from Triton's own caches of compiled kernels. The interpreter compiles
nothing: there each launch's key is computed by the function Triton itself keys its cache with,
for a Hopper target, and recorded. That is the twin the tests hold the warm-up to."""

from __future__ import annotations

import inspect
from collections.abc import Sized
from typing import Any

import torch

from argosy.kernels.triton_runtime import INTERPRETED

LAUNCHED: list[Any] = []  # every kernel the engine launches, in definition order
_RECORDED: dict[str, set[tuple]] = {}  # interpreted: each kernel's keys, as launches would compile them


def launched(kernel: Any) -> Any:
    """Marks a @triton.jit kernel as one the engine launches (the device functions they call are
    not); interpreted, its launches record their keys."""
    LAUNCHED.append(kernel)
    if INTERPRETED:
        keys = _RECORDED.setdefault(kernel.fn.__name__, set())
        run = kernel.run

        def recording_run(*args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            keys.add(variant_key(kernel, args, kwargs))
            return run(*args, grid=grid, warmup=warmup, **kwargs)

        kernel.run = recording_run
    return kernel


def variant_key(kernel: Any, args: tuple, kwargs: dict) -> tuple:
    """The key a launch with these arguments compiles under, as Triton computes it for sm_90:
    constexprs by value, every other argument by what Triton specialises it on, then the
    launch options."""
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import native_specialize_impl

    params = inspect.signature(kernel.fn).parameters
    bound = dict(zip(params, args)) | {k: v for k, v in kwargs.items() if k in params}
    # A compiled kernel keeps the names; an interpreted one, the arguments it was made with.
    compiled = hasattr(kernel, "do_not_specialize")
    unspecialised = set((kernel.do_not_specialize if compiled else kernel.kwargs.get("do_not_specialize")) or ())
    key: list[tuple] = []
    for name, param in params.items():
        if "constexpr" in str(param.annotation):
            key.append(("constexpr", bound[name]))
        else:
            key.append(native_specialize_impl(CUDABackend, bound[name], False, name not in unspecialised, True))
    return (*key, *sorted((k, v) for k, v in kwargs.items() if k not in params))


class CompiledVariants:
    """How many variants of the launched kernels exist on `device`, and which kernels compiled
    new ones since it was made (after the warm-up). Triton's caches are the process's: an
    engine started beside another in one process shows the other's warm-up too."""

    def __init__(self, device: torch.device):
        self._caches: dict[str, Sized] = {kernel.fn.__name__: _cache_of(kernel, device) for kernel in LAUNCHED}
        self._seen = self.by_kernel()
        self._total = self.count()

    def count(self) -> int:
        return sum(map(len, self._caches.values()))

    def by_kernel(self) -> dict[str, int]:
        return {name: len(cache) for name, cache in self._caches.items()}

    def new(self) -> dict[str, int]:
        """The kernels with variants compiled since the last call (or since it was made), and
        how many each has now; cheap when there are none (a sum of a few lengths)."""
        if self.count() == self._total:
            return {}
        now = self.by_kernel()
        grown = {name: n for name, n in now.items() if n > self._seen[name]}
        self._seen, self._total = now, sum(now.values())
        return grown


def _cache_of(kernel: Any, device: torch.device) -> Sized:
    if INTERPRETED:
        return _RECORDED[kernel.fn.__name__]
    # Triton keeps, per device index, (compiled kernels by key, key cache, target, backend, binder).
    index = device.index if device.index is not None else torch.cuda.current_device()
    return kernel.device_caches[index][0]
