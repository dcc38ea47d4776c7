"""Files generated from the code (the CRDs, the docs' reference pages), written or checked."""

from __future__ import annotations

import sys
from pathlib import Path


def sync_generated(texts: dict[Path, str], root: Path, command: str, check: bool) -> int:
    """Writes each file whose text differs (with `check`, only reports them, exiting 1); the
    paths are shown relative to `root`, with the command that regenerates them."""
    stale = [path for path, text in texts.items() if not path.is_file() or path.read_text() != text]
    if check:
        for path in stale:
            print(f"{path.relative_to(root)} is out of date: run {command}", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[path])
        print(f"wrote {path.relative_to(root)}")
    return 0
