"""Building the CPU kernels survives a build that was killed midway: the lock file PyTorch's
own build leaves behind must not make every later load wait for ever."""

from __future__ import annotations

import subprocess
import sys

import pytest

from argosy.kernels.cpu_kernels import build_directory, cpu_kernels

pytestmark = pytest.mark.cpu_kernels  # host tensors, even where CUDA is present

LOAD = "from argosy.kernels.cpu_kernels import cpu_kernels; assert cpu_kernels() is not None"


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_load():
    assert cpu_kernels() is not None, "the kernels must build where the tests run"
    stale = build_directory() / "lock"
    stale.touch()  # what a build killed between taking and releasing PyTorch's lock leaves
    done = subprocess.run([sys.executable, "-P", "-c", LOAD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists()


def test_a_first_build_says_what_it_does_and_that_it_happens_once(monkeypatch, tmp_path, caplog):
    """A first start is otherwise silent for the minute the compiler takes."""
    import torch.utils.cpp_extension

    built = object()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda *args, **kwargs: built)
    cpu_kernels.cache_clear()
    try:
        with caplog.at_level("INFO", logger="argosy.kernels"):
            assert cpu_kernels() is built
        assert "compiling the CPU kernels for this processor (once" in caplog.text
        caplog.clear()
        (build_directory() / "argosy_cpu_kernels.so").touch()  # what a finished build leaves
        cpu_kernels.cache_clear()
        with caplog.at_level("INFO", logger="argosy.kernels"):
            assert cpu_kernels() is built
        assert "compiling" not in caplog.text
    finally:
        cpu_kernels.cache_clear()
