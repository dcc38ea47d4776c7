"""The source folders are importable only as argosy.*: Python's own `operator` module stays
reachable from the repository root, in the editable install and in a built wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from argosy.kernels.cpu_kernels import SOURCES

ROOT = Path(__file__).resolve().parents[1]
CHECK = (
    "import operator, argosy.operator, argosy.server.engine.llm_engine, argosy.kernels.paged_attention;"
    "assert operator.__file__.startswith(%r), operator.__file__;"
    "assert callable(operator.itemgetter); print(argosy.operator.__file__)"
)
STDLIB = str(
    Path(
        subprocess.check_output(
            [sys.executable, "-P", "-c", "import sysconfig;print(sysconfig.get_paths()['stdlib'])"], text=True
        ).strip()
    )
)


def run_python(code: str, cwd: Path, env: dict | None = None) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True
    ).stdout


def test_stdlib_operator_wins_from_the_repository_root():
    out = run_python(CHECK % STDLIB, ROOT)
    assert out.strip() == str(ROOT / "operator" / "__init__.py")


def test_every_source_folder_is_a_listed_package():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapping = config["package-dir"]
    for package, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder).parts
            assert ".".join((package, *relative)) in listed, f"{init.parent} is missing from pyproject packages"


def test_built_wheel_contains_the_packages_and_keeps_stdlib_operator(tmp_path):
    # Built from a clean copy: setuptools never empties a build/ folder, so one left in the
    # checkout could smuggle files that no longer exist into the wheel.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        capture_output=True,
        # The layout is what is tested here; the kernels' builds, by tests/kernels/test_cpu_kernels_build.py.
        env={**os.environ, "ARGOSY_BUILD_CPU_KERNELS": "0"},
    )
    (wheel,) = tmp_path.glob("argosy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "argosy/operator/__init__.py" in names and "argosy/server/engine/llm_engine.py" in names
    # The CPU kernels' sources go with it: a build made elsewhere, or none, is compiled on first use.
    assert {f"argosy/kernels/{source.name}" for source in SOURCES} | {"argosy/kernels/cpu_bf16.h"} <= set(names)
    assert not any(n.split("/")[0] in ("operator", "server", "kernels") for n in names)
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    # Run from an empty folder with only the wheel's contents ahead of the installed packages.
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    out = run_python(CHECK % STDLIB, tmp_path, env)
    assert out.strip() == str(site / "argosy" / "operator" / "__init__.py")
