"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing anchor,
a page left out of the navigation or a snippet that names a missing file fails it; and the
reference pages are what the code generates."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from argosy import reference_docs

ROOT = Path(__file__).resolve().parents[1]


def test_the_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
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
