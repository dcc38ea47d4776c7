"""The documentation site builds with `mkdocs build --strict`: a broken link, a missing anchor,
a page left out of the navigation or a snippet that names a missing file fails it; and the
reference pages are what the code generates."""

from __future__ import annotations

import os
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
