"""Without CUDA, Triton runs in its interpreter, which must be chosen before triton is first
imported: the entry points choose it first, and a late choice fails with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA, Triton compiles")


def run(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-P", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_choosing_first_lets_anything_import_triton_after(tmp_path):
    result = run(
        "from argosy.kernels.interpreter import use_interpreter_without_cuda; use_interpreter_without_cuda();"
        "import triton;"  # as transformers does, converting a checkpoint
        "from argosy.kernels.triton_runtime import INTERPRETED; assert INTERPRETED",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr


def test_triton_imported_before_the_choice_is_a_clear_error(tmp_path):
    result = run("import triton; import argosy.kernels.triton_runtime", tmp_path)
    assert result.returncode != 0
    assert "set TRITON_INTERPRET=1" in result.stderr and "--attention-backend torch" in result.stderr
