"""The checkout's root never joins sys.path, so no source folder is importable by its bare name:
the folders are packaged as argosy.*, the README's test command runs `python -P -m pytest`, and
every Python the project starts or documents from the root runs with -P. Otherwise `kernels/`
shadows Hugging Face's `kernels` package, which transformers imports whenever it is installed
(the test extra installs it, so this suite always runs beside the package it could shadow)."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Every top-level folder but the package itself: a folder with no __init__.py still imports, as a
# namespace package, when its parent is on sys.path.
FOLDERS = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and p.name != "argosy" and p.name.isidentifier())
# Files that start Python from the root without -P on purpose, and why.
ROOT_ON_PATH_ON_PURPOSE = {
    "tests/test_packaging.py": "proves Python's own operator wins even with the root on sys.path",
}
DOCUMENTED = [
    "README.md",
    ".ci/run",
    "bench/gpu.sh",
    "mkdocs.yml",
    *(f"docs/{p.relative_to(ROOT / 'docs')}" for p in (ROOT / "docs").rglob("*.md")),
]


def folders_on_the_path() -> dict[str, list[str]]:
    """Each source folder that the import system would find from sys.path, with where."""
    found = {}
    for name in FOLDERS:
        spec = importlib.machinery.PathFinder.find_spec(name)
        locations = [spec.origin, *(spec.submodule_search_locations or [])] if spec else []
        inside = [loc for loc in locations if loc and Path(loc).resolve().is_relative_to(ROOT)]
        if inside:
            found[name] = inside
    return found


def test_no_source_folder_is_importable_by_its_bare_name():
    assert "kernels" in FOLDERS and "operator" in FOLDERS and "tests" in FOLDERS
    shadowed = folders_on_the_path()
    assert shadowed == {}, f"source folders shadow top-level names from sys.path {sys.path}: {shadowed}"


def test_the_packages_those_names_belong_to_are_the_real_ones():
    import operator

    kernels = importlib.import_module("kernels")
    assert not Path(kernels.__file__).resolve().is_relative_to(ROOT), kernels.__file__
    assert hasattr(kernels, "CUDAProperties")  # what transformers' hub-kernels integration imports
    assert not Path(operator.__file__).resolve().is_relative_to(ROOT) and callable(operator.itemgetter)
    importlib.import_module("transformers.integrations.hub_kernels")


def run_the_check(*flags: str) -> subprocess.CompletedProcess:
    test = "tests/test_import_path.py::test_no_source_folder_is_importable_by_its_bare_name"
    return subprocess.run(
        [sys.executable, *flags, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", test],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_check_fails_with_the_root_on_the_path():
    """`python -m pytest` from the root (the command before -P) puts the root first on sys.path."""
    with_root, without = run_the_check(), run_the_check("-P")
    assert with_root.returncode == 1, with_root.stdout[-3000:] + with_root.stderr[-3000:]
    assert "source folders shadow" in with_root.stdout and "'kernels'" in with_root.stdout
    assert without.returncode == 0, without.stdout[-3000:] + without.stderr[-3000:]


def python_started_without_dash_p(path: Path) -> list[int]:
    """Lines where the file starts `sys.executable -m ...` or `-c ...` without -P."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.List | ast.Tuple) and len(node.elts) > 1:
            first, second = node.elts[:2]
            if (
                ast.unparse(first) == "sys.executable"
                and isinstance(second, ast.Constant)
                and second.value in ("-m", "-c")
            ):
                lines.append(node.lineno)
    return lines


def test_every_python_the_project_starts_runs_with_dash_p():
    found = {}
    for folder in ("argosy", "server", "operator", "kernels", "tests", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            relative = str(path.relative_to(ROOT))
            if relative not in ROOT_ON_PATH_ON_PURPOSE and (lines := python_started_without_dash_p(path)):
                found[relative] = lines
    assert found == {}
    assert python_started_without_dash_p(ROOT / "tests" / "test_packaging.py")  # the exception is still needed


def test_every_documented_python_command_runs_with_dash_p():
    pattern = re.compile(r"\bpython3?\s+-[mc]\b")
    found = {name: pattern.findall(text) for name in DOCUMENTED if pattern.search(text := (ROOT / name).read_text())}
    assert found == {}
    assert "python -P -m pytest" in (ROOT / ".ci" / "run").read_text()
