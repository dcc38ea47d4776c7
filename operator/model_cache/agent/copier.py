"""copy_files: one attempt at a copy, into its staging folder. Each file resumes from what the
staging folder already holds (an attempt that failed, or an agent that was stopped, leaves its
bytes there); then every file is read back and checked by size and SHA-256, and a file that
fails is removed, so that the next attempt fetches it again."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from argosy.operator.model_cache.agent.manifest import Manifest, file_sha256
from argosy.operator.model_cache.agent.sources import FetchError, FileSource

RATE_WINDOW_SECONDS = 5.0


class Progress:
    """The attempt's phase, bytes done of the total, and the rate over the last few seconds;
    read by the agent's reports while the copying thread writes it."""

    def __init__(self, total: int):
        self.phase, self.done, self.total = "Copying", 0, total
        self._samples: list[tuple[float, int]] = [(time.monotonic(), 0)]

    def start(self, phase: str, done: int) -> None:
        self.phase, self.done = phase, done
        self._samples = [(time.monotonic(), done)]

    def add(self, count: int) -> None:
        self.done += count
        now = time.monotonic()
        self._samples.append((now, self.done))
        while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_SECONDS:
            self._samples.pop(0)

    @property
    def rate(self) -> int:
        (first, done_then), (last, done_now) = self._samples[0], self._samples[-1]
        return int((done_now - done_then) / (last - first)) if last > first else 0


class Stopped(Exception):
    """The attempt was asked to stop (the agent is shutting down, or the spec changed)."""


def copy_files(
    manifest: Manifest, source: FileSource, staging: Path, progress: Progress, stop: threading.Event
) -> None:
    staging.mkdir(parents=True, exist_ok=True)
    wanted = {staging / f.path for f in manifest.files}
    for path in [p for p in staging.rglob("*") if p.is_file() and p not in wanted]:
        path.unlink()  # left by an earlier manifest
    held = {f.path: _size(staging / f.path) for f in manifest.files}
    progress.start("Copying", sum(min(held[f.path], f.size) for f in manifest.files))
    for f in manifest.files:
        if held[f.path] < f.size:
            _fetch(source, f.path, staging / f.path, held[f.path], progress, stop)
        size = _size(staging / f.path)
        if size != f.size:
            (staging / f.path).unlink(missing_ok=True)
            raise FetchError("SizeMismatch", f"{f.path}: {size} bytes from the source, the manifest says {f.size}")
    progress.start("Verifying", 0)
    for f in manifest.files:
        if stop.is_set():
            raise Stopped()
        found = file_sha256(staging / f.path, progress.add)
        if found != f.sha256:
            (staging / f.path).unlink()
            raise FetchError("ChecksumMismatch", f"{f.path}: SHA-256 {found}, the manifest says {f.sha256}")


def _fetch(source: FileSource, path: str, dest: Path, held: int, progress: Progress, stop: threading.Event) -> None:
    start, chunks = source.read(path, held)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "r+b" if dest.exists() else "wb") as out:
        out.seek(start)
        out.truncate()
        progress.add(start - held)  # negative where the source could not resume
        for chunk in chunks:
            if stop.is_set():
                raise Stopped()
            out.write(chunk)
            progress.add(len(chunk))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0
