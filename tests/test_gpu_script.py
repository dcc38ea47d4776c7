"""bench/gpu.sh, the one script of GPU measurements, run in its CPU dry run: every step it takes
on the GPU (tests, bench/gpu_kernels.py's shape paths, the throughput bench) runs at toy sizes,
so the script works the first time it meets a GPU."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run_writes_every_table(tmp_path):
    result = subprocess.run(
        ["bash", "bench/gpu.sh", "--dry-run"],
        cwd=ROOT,
        env={**os.environ, "OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    kernels = (tmp_path / "kernels.txt").read_text()
    assert "| batch | context | splits |" in kernels and "| fp8 |" in kernels
    assert "graphs speed-up" in kernels
    assert "| exactly 4 tokens each" in (tmp_path / "throughput.txt").read_text()
    assert "== tests: exit 0" in (tmp_path / "tests.txt").read_text()
