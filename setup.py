"""The CPU kernels built at install, one extension module per instruction-set level
(`argosy.kernels._cpu_<level>`, kernels/cpu_build.py), so that a first start compiles nothing.
It needs torch's headers: install with `--no-build-isolation` once torch is installed. Without
torch or a compiler here, the install goes on and the kernels are compiled on first use;
ARGOSY_BUILD_CPU_KERNELS=0 skips them. Everything else is in pyproject.toml."""

from __future__ import annotations

import importlib.util
import logging
import os
import platform
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).parent


def _cpu_build():
    """kernels/cpu_build.py, read from its file: the package is not installed yet."""
    spec = importlib.util.spec_from_file_location("cpu_build", ROOT / "kernels" / "cpu_build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_kernel_modules() -> dict:
    if os.environ.get("ARGOSY_BUILD_CPU_KERNELS") == "0":
        return {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:  # an isolated build: no torch to build against
        return {}

    class BuildEachLevel(BuildExtension):
        """A level that fails to build leaves its kernels to be compiled on first use."""

        def build_extension(self, ext) -> None:
            try:
                super().build_extension(ext)
            except Exception as exc:
                logging.warning("%s was not built (%s): it is compiled on first use instead", ext.name, exc)

    build = _cpu_build()
    modules = [
        CppExtension(
            f"argosy.kernels._cpu_{level}",
            [str(source.relative_to(ROOT)) for source in build.SOURCES],
            extra_compile_args=build.build_flags(level, torch.__version__),
            extra_link_args=build.LINK_FLAGS,
        )
        for level in build.levels_for(platform.machine())
    ]
    return {"ext_modules": modules, "cmdclass": {"build_ext": BuildEachLevel}}


setup(**cpu_kernel_modules())
