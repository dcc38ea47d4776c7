"""The folder layout is the architecture, and its seams hold: the engine (scheduling, in tokens)
and the worker (the device side) never import each other; they meet in the executor's step
plan. The engine needs no torch."""

from __future__ import annotations

import ast
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
