"""The folder layout is the architecture, and its seams hold: the engine (scheduling, in tokens)
and the worker (the device side) never import each other; they meet in the executor's step
plan. No file of server/ or kernels/ is in an import circle, counting every import (in functions
and for type checking too). The engine needs no torch, and the device side needs no Triton
unless its backend is Triton's (Triton is not installed everywhere PyTorch is)."""

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


def import_graph(folders: tuple[str, ...]) -> dict[str, set[str]]:
    """Every module of the folders (by its package name) and the modules of the folders it
    imports, wherever the import statement is."""
    modules = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            name = "argosy." + ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
        graph[name] = found & modules.keys() - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for to in graph[node]:
            if to not in index:
                visit(to)
                low[node] = min(low[node], low[to])
            elif to in stack:
                low[node] = min(low[node], index[to])
        if low[node] == index[node]:
            group = set()
            while (member := stack.pop()) != node:
                group.add(member)
            if group:
                found.append(group | {node})

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_file_of_the_server_the_kernels_or_the_simulator_is_in_an_import_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]  # it can fail
    assert circles(import_graph(("server", "kernels", "simulator"))) == []


def test_the_simulator_sits_on_top_and_runs_no_model():
    """The simulator drives the engine and the operator's builders; neither ever imports it, and a
    simulation loads neither torch nor Triton (its replicas run the engine on a profile's clock)."""
    graph = import_graph(("server", "kernels", "operator", "simulator"))
    below = {m: names for m, names in graph.items() if not m.startswith("argosy.simulator")}
    assert {m for m, names in below.items() if any(n.startswith("argosy.simulator") for n in names)} == set()
    check = (
        "import sys\n"
        "from argosy.simulator import simulation, simulate_command\n"
        "assert not {'torch', 'triton'} & set(sys.modules), 'the simulator loaded a device library'\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_engine_needs_no_torch():
    assert {
        m for m, names in imports("server/engine").items() if any(n.split(".")[0] == "torch" for n in names)
    } == set()


def test_the_device_side_on_the_torch_backend_never_imports_triton():
    check = (
        "import sys, torch\n"
        "from argosy.server.worker import worker, model_runner\n"
        "from argosy.server.executor import in_process, multiproc\n"
        "from argosy.kernels.attention_backend import select_backend\n"
        "select_backend('torch', torch.device('cpu'), 2)\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
