"""The README's set-up commands are the ones CI runs."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_exactly_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line and not line.startswith("#")]
    assert test_command in ci_lines


def test_readme_run_command_uses_the_installed_cli():
    run_command = readme_commands()[0]
    assert run_command.startswith("pip install torch==2.13.0 -e . ") and run_command.endswith("argosy serve")
