"""Building the CPU kernels: one build per instruction-set level, made at install so that a first
start compiles nothing; the level chosen from what the CPU reports, a lower one forced by
ARGOSY_CPU_ISA and a higher one refused by name; and a build on first use that survives one
killed midway (the lock file PyTorch's own build leaves behind must not make every later load
wait for ever) and says what it does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from argosy.kernels import cpu_kernels as kernels_module
from argosy.kernels.cpu_build import LEVELS, levels_for
from argosy.kernels.cpu_isa import ISA_ENV, CpuIsaError, chosen_level, machine_levels, supported_levels
from argosy.kernels.cpu_kernels import build_directory, cpu_kernels, kernels_at

pytestmark = pytest.mark.cpu_kernels  # host tensors, even where CUDA is present

AVX2 = frozenset({"sse2", "avx", "avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


def test_the_levels_a_cpu_runs_come_from_its_flags():
    assert supported_levels(AVX2, "x86_64") == ["portable", "avx2"]
    assert supported_levels(AVX512, "x86_64") == ["portable", "avx2", "avx512"]
    assert supported_levels(AVX512 | {"avx512_bf16"}, "x86_64") == list(LEVELS)
    assert supported_levels(AVX512 | {"avx512_bf16"}, "aarch64") == ["portable"]  # x86 flags mean nothing there
    assert supported_levels(frozenset({"avx2"}), "x86_64") == ["portable"]  # AVX2 without FMA
    assert levels_for("aarch64") == ["portable"] and levels_for("x86_64") == list(LEVELS)


def test_the_highest_level_is_chosen_unless_a_lower_one_is_forced():
    runs = ["portable", "avx2", "avx512"]
    assert chosen_level(None, runs) == "avx512" and chosen_level("", runs) == "avx512"
    assert chosen_level("avx2", runs) == "avx2"
    with pytest.raises(CpuIsaError, match=r"ARGOSY_CPU_ISA='avx512_bf16' is beyond this CPU, .*lacks avx512_bf16"):
        chosen_level("avx512_bf16", runs)
    with pytest.raises(CpuIsaError, match="names no instruction-set level: one of portable, avx2, avx512, avx512_bf16"):
        chosen_level("sse4", runs)


def test_a_forced_level_beyond_the_cpu_stops_the_engine_by_name(monkeypatch):
    monkeypatch.setenv(ISA_ENV, "neon")
    cpu_kernels.cache_clear()
    try:
        with pytest.raises(CpuIsaError, match="ARGOSY_CPU_ISA='neon'"):
            cpu_kernels()
    finally:
        monkeypatch.delenv(ISA_ENV)
        cpu_kernels.cache_clear()


FIRST_START = """
from argosy.kernels.cpu_kernels import kernels_at
from argosy.kernels.cpu_isa import machine_levels
print(" ".join(kernels_at(level).__name__ for level in machine_levels()))
"""


def test_an_installed_package_compiles_nothing_at_its_first_start(tmp_path):
    """The README's install built every level (setup.py): a process with an empty extensions
    folder loads them and compiles nothing there."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-P", "-c", FIRST_START], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [f"argosy.kernels._cpu_{level}" for level in machine_levels()]
    assert list(tmp_path.iterdir()) == []


REBUILD = """
import argosy.kernels.cpu_kernels as kernels
kernels.prebuilt = lambda level: None  # as where the installed build is of other sources
module = kernels.kernels_at("portable")
assert module.sources_digest == kernels.sources_digest(), module.sources_digest
"""


def test_a_stale_install_compiles_on_first_use_past_a_lock_left_by_a_killed_build(tmp_path):
    """A build on first use (a developer's edited kernels, another torch) really compiles, with
    the flags setup.py uses; PyTorch's build waits for ever while its lock file exists, and one
    killed midway leaves it: under our flock no build of ours runs, so the file goes."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    stale = tmp_path / build_directory("portable").name / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    done = subprocess.run([sys.executable, "-P", "-c", REBUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists()


def test_a_first_build_says_what_it_does_and_that_it_happens_once(monkeypatch, tmp_path, caplog):
    """A first start without an installed build is otherwise silent while the compiler runs."""
    import torch.utils.cpp_extension

    built = object()
    level = machine_levels()[-1]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(torch.utils.cpp_extension, "load", lambda *args, **kwargs: built)
    monkeypatch.setattr(kernels_module, "prebuilt", lambda level: None)
    kernels_at.cache_clear()
    try:
        with caplog.at_level("INFO", logger="argosy.kernels"):
            assert kernels_at(level) is built
        assert f"compiling the CPU kernels for {level} (once" in caplog.text
        caplog.clear()
        (build_directory(level) / f"argosy_cpu_kernels_{level}.so").touch()  # what a finished build leaves
        kernels_at.cache_clear()
        with caplog.at_level("INFO", logger="argosy.kernels"):
            assert kernels_at(level) is built
        assert "compiling" not in caplog.text
    finally:
        kernels_at.cache_clear()
        cpu_kernels.cache_clear()
