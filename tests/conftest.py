from __future__ import annotations

import pytest

from argosy.kernels.cpu_isa import ISA_ENV, machine_levels
from argosy.kernels.cpu_kernels import cpu_kernels
from argosy.kernels.interpreter import use_interpreter_without_cuda
from tests.checkpoints import ARCHS, build_checkpoint

# Triton's interpreter must be chosen before anything (transformers, building the test
# checkpoints) imports triton; on a GPU the kernel tests run compiled.
use_interpreter_without_cuda()


@pytest.fixture(scope="session", autouse=True)
def cpu_kernels_built() -> None:
    """On a fresh machine the first use compiles the CPU kernels (a minute or more): here, once,
    rather than inside the start-up timeout of the first server a test launches."""
    cpu_kernels()


@pytest.fixture(params=machine_levels())
def each_cpu_level(request, monkeypatch) -> str:
    """Each instruction-set level of the CPU kernels this machine runs, forced in turn
    (ARGOSY_CPU_ISA): every variant is tested against the same reference."""
    monkeypatch.setenv(ISA_ENV, request.param)
    cpu_kernels.cache_clear()
    yield request.param
    cpu_kernels.cache_clear()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: build_checkpoint(root / arch, arch) for arch in ARCHS}


@pytest.fixture(scope="session")
def llama_checkpoint(checkpoints):
    return checkpoints["llama"]
