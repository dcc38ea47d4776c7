"""bench/gpu.sh, the one script of GPU measurements, run in its CPU dry run: every step it takes
on the GPU (tests, bench/gpu_kernels.py's shape paths, the throughput bench) runs at toy sizes
and without the packages the GPU machine lacks, so the script works the first time it meets a GPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# What the GPU machine lacks (its packages are listed in the GPU machine's notes): the GPU tests
# and everything they load must import without these.
ABSENT_ON_THE_GPU_MACHINE = ("pydantic", "fastapi", "uvicorn", "kopf", "kubernetes", "openai")
BLOCKER = f"""
import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT_ON_THE_GPU_MACHINE!r}:
            raise ImportError("not on the GPU machine: " + name)
sys.meta_path.insert(0, _Absent())
"""


def test_gpu_script_dry_run_writes_every_table(tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    result = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry-run"],
        cwd=ROOT,
        env={**os.environ, "OUT": str(tmp_path), "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kernels = (tmp_path / "kernels.txt").read_text()
    assert "| batch | context | splits |" in kernels and "| fp8 |" in kernels
    assert "graphs speed-up" in kernels
    throughput = (tmp_path / "throughput.txt").read_text()
    assert "| argosy engine |" in throughput and "| step / products |" in throughput
    assert "== tests: exit 0" in (tmp_path / "tests.txt").read_text()


def test_the_gpu_tests_need_nothing_the_gpu_machine_lacks(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    script = (ROOT / "bench" / "gpu.sh").read_text()
    tests = re.search(r"GPU_TESTS=\(([^)]*)\)", script).group(1).split()
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    blocked = subprocess.run([sys.executable, "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert "not on the GPU machine" in blocked.stderr  # the blocker is in force
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error" not in result.stdout.lower()
