"""The folder layout is the architecture, and its seams hold: the engine (scheduling, in tokens)
and the worker (the device side) never import each other; they meet in the executor's step
plan. The engine needs no torch, and the device side needs no Triton unless its backend is
Triton's (Triton is not installed everywhere PyTorch is)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imports(folder: str) -> dict[str, set[str]]:
    """Each module of a folder, and the modules it imports (absolute names)."""
    found = {}
    for path in sorted((ROOT / folder).glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[path.name] = names
    return found


def test_the_engine_and_the_worker_do_not_import_each_other():
    engine = {
        m: [n for n in names if n.startswith("argosy.server.worker")] for m, names in imports("server/engine").items()
    }
    worker = {
        m: [n for n in names if n.startswith("argosy.server.engine.")] for m, names in imports("server/worker").items()
    }
    assert {m: n for m, n in engine.items() if n} == {}
    assert {m: n for m, n in worker.items() if n} == {}


def test_the_engine_needs_no_torch():
    assert {
        m for m, names in imports("server/engine").items() if any(n.split(".")[0] == "torch" for n in names)
    } == set()


def test_the_device_side_on_the_torch_backend_never_imports_triton():
    check = (
        "import sys, torch\n"
        "from argosy.server.worker import executor, model_runner\n"
        "from argosy.kernels.attention_backend import select_backend\n"
        "select_backend('torch', torch.device('cpu'), 2)\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
