"""bench/gpu.sh, the one script of GPU measurements, run in its CPU dry run: every step it takes
on the GPU (bench/gpu_kernels.py's shape paths, the end-to-end decode bench on a random
checkpoint, the tests, the throughput and LoRA benches) runs at toy sizes and without the packages
the GPU machine lacks (the no-compile-after-start-up check runs in the suite itself, and is
collected here without them), in the order that puts the figures that matter most first, so the
script works the first time it meets a GPU."""

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
    decode = (tmp_path / "decode.txt").read_text()
    assert "| batch | ms per step | tokens/s | roofline tokens/s | of roofline |" in decode and "| 2 |" in decode
    throughput = (tmp_path / "throughput.txt").read_text()
    assert "| argosy engine |" in throughput and "| step / products |" in throughput
    lora = (tmp_path / "lora.txt").read_text()
    assert "| 8 adapters, rank 16, mixed in every step |" in lora and "| rank 64: copied into a device slot |" in lora
    assert "== tests: exit 0" in (tmp_path / "tests.txt").read_text()
    assert "| async |" in (tmp_path / "async.txt").read_text()
    assert "== tp-bench: exit 0" in (tmp_path / "tp-bench.txt").read_text()


def test_the_structured_step_runs_where_the_wheels_came_along():
    """The dry run above skips it, as the GPU machine does without xgrammar's and pydantic's wheels;
    here both are installed, so its command runs as gpu.sh's dry run would give it."""
    script = (ROOT / "bench" / "gpu.sh").read_text()
    command = re.search(r"step structured 300 (python3 bench/structured\.py [^\n]*)", script).group(1)
    result = subprocess.run(
        [sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| 2 |" in result.stdout and "| mask fill + apply + advance" in result.stdout


def test_the_gpu_tests_need_nothing_the_gpu_machine_lacks(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(BLOCKER)
    script = (ROOT / "bench" / "gpu.sh").read_text()
    tests = [
        arg
        for name in ("GPU_TESTS", "VARIANTS_TEST")
        for arg in re.search(name + r"=\(([^)]*)\)", script).group(1).split()
    ]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    blocked = subprocess.run([sys.executable, "-P", "-c", "import pydantic"], env=env, capture_output=True, text=True)
    assert "not on the GPU machine" in blocked.stderr  # the blocker is in force
    result = subprocess.run(
        [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "error" not in result.stdout.lower()


def test_the_figures_that_matter_most_come_first_each_under_its_own_limit():
    script = (ROOT / "bench" / "gpu.sh").read_text()
    gpu_run = script[script.index("else\n    step kernels") :]
    steps = re.findall(r"step (\w+) (\d+) ", gpu_run)
    assert [name for name, _ in steps] == [
        "kernels", "decode", "tests", "variants", "throughput", "async", "lora", "structured"
    ]  # fmt: skip
    assert sum(int(limit) for _, limit in steps) <= 8 * 60 - 20  # with the install, within GPU.md's 8 minutes
