"""The whole tree passes the linter and is formatted as the formatter writes it (ruff, as
configured in pyproject.toml): `ruff check --fix . && ruff format .` mends most findings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff_is_clean(command):
    result = subprocess.run([sys.executable, "-P", "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
