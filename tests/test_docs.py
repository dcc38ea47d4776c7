"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing anchor,
a page left out of the navigation or a snippet that names a missing file fails it; and the
reference pages are what the code generates; every reason the operator can report is explained;
and every example on the pages names what exists: shell commands their scripts, flags and
files, Python its imports, resources what their CRD admits."""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from argosy import cli, reference_docs

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-P", "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "getting-started" / "index.html").is_file()
    # The quick start is the README's own, included: the pages never restate it.
    assert "On a fresh machine" in (tmp_path / "site" / "getting-started" / "index.html").read_text()


def test_the_reference_pages_are_what_the_code_generates():
    assert reference_docs.main(["--check"]) == 0
    for name, make in reference_docs.PAGES.items():
        assert (reference_docs.REFERENCE / name).read_text() == reference_docs.HEADER + make()


def test_a_stale_reference_page_is_reported(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(reference_docs, "ROOT", tmp_path)
    monkeypatch.setattr(reference_docs, "REFERENCE", tmp_path / "docs" / "reference")
    assert reference_docs.main([]) == 0
    page = tmp_path / "docs" / "reference" / "metrics.md"
    page.write_text(page.read_text().replace("argosy_num_requests_waiting", "argosy_queue"))
    assert reference_docs.main(["--check"]) == 1 and "metrics.md is out of date" in capsys.readouterr().err
    assert reference_docs.main([]) == 0 and reference_docs.main(["--check"]) == 0


def reasons_in_code() -> set[str]:
    """Every CamelCase reason the operator and the agent can report."""
    from argosy.operator.reconcile import ADD_ON_KINDS
    from argosy.operator.routing_status import _FALSE_REASONS
    from argosy.operator.status import _STUCK_CONTAINER

    found = {reason for reason, _ in ADD_ON_KINDS.values()} | set(_FALSE_REASONS.values())
    found |= set(_STUCK_CONTAINER.values())
    pattern = re.compile(r'(?:Problem|FetchError|Decision)\(\s*(?:"[A-Za-z]+",\s*)?"([A-Z][A-Za-z]+)"')
    for path in (ROOT / "operator").rglob("*.py"):
        text = path.read_text()
        found |= set(pattern.findall(text))
        found |= set(re.findall(r'"reason": "([A-Z][A-Za-z]+)"', text))
        found |= set(re.findall(r'return "(?:True|False)", "([A-Z][A-Za-z]+)"', text))
    return found - {"Pending", "Ready", "Failed", "Evicting"}  # phases that Decision(...) names first


def test_every_reason_the_code_reports_is_explained():
    page = (ROOT / "docs" / "operator" / "status.md").read_text()
    reasons = reasons_in_code()
    assert {"ModelPathMissing", "QuotaExceeded", "ChecksumMismatch", "RouteNotAccepted", "ClaimNotMounted"} <= reasons
    missing = sorted(r for r in reasons if f"`{r}`" not in page)
    assert missing == []


def code_blocks(language: str) -> list[tuple[str, str]]:
    """(page, block) for every fenced block of `language` on the pages and the README."""
    found = []
    for path in [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]:
        for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", path.read_text(), re.S | re.M):
            if lang == language:
                found.append((str(path.relative_to(ROOT)), body))
    return found


def shell_commands() -> list[tuple[str, list[str]]]:
    """Every command of the pages' bash blocks, as its words (continuations and quoted lines
    joined, `&&` split, comments dropped)."""
    commands = []
    for page, body in code_blocks("bash"):
        pending = ""
        for line in body.replace("\\\n", " ").splitlines():
            pending += line + "\n"
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # a quotation continues on the next line
                continue
            pending = ""
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                commands.append((page, words[:cut]))
                words = words[cut + 1 :]
        assert not pending, f"{page}: an unclosed quotation"
    return commands


def check_command(words: list[str]) -> None:
    program, args = words[0], words[1:]
    if program == "argosy":
        verb, module, add_args, _ = (args[0], *cli.VERBS[args[0]][1:])
        parser = argparse.ArgumentParser(prog=f"argosy {verb}", exit_on_error=False)
        getattr(importlib.import_module(module), add_args)(parser)
        parser.parse_args(args[1:])
    elif program == "python" and args[:2] == ["-P", "-m"]:
        assert importlib.util.find_spec(args[2]) is not None, args[2]
    elif program in ("python", "bash") and args[0].endswith((".py", ".sh")):
        source = (ROOT / args[0]).read_text()
        for flag in (a.split("=")[0] for a in args[1:] if a.startswith("--")):
            assert flag in source, f"{args[0]} has no {flag}"
    elif program in ("kubectl", "helm"):
        for arg in args:
            if arg.startswith(("examples/", "crds/", "charts/")):
                assert (ROOT / arg).exists(), arg


def test_every_shell_command_on_the_pages_names_what_exists():
    commands = shell_commands()
    assert any(words[0] == "argosy" for _, words in commands)
    for page, words in commands:
        try:
            check_command(words)
        except (argparse.ArgumentError, AssertionError, OSError, SystemExit) as exc:
            raise AssertionError(f"{page}: {shlex.join(words)}: {exc}") from exc


def test_every_python_example_parses_and_imports_what_exists():
    blocks = code_blocks("python")
    assert blocks
    for page, body in blocks:
        tree = ast.parse(body, filename=page)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("argosy"):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"{page}: {node.module} has no {missing}"


def test_every_resource_example_on_the_pages_is_admitted():
    from tests.operator.crd_schema import admit, load_crd, openapi_schema

    checked = 0
    for page, body in code_blocks("yaml"):
        for doc in yaml.safe_load_all(body):
            if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith("argosy.dev/"):
                crd = load_crd(f"{doc['kind'].lower()}s.argosy.dev")
                assert admit(doc, openapi_schema(crd))[1] == [], page
                checked += 1
    assert checked
