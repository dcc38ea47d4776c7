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
    done = subprocess.run([sys.executable, "-c", LOAD], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists()
