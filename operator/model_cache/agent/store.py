"""CacheStore: the node's cache root on disk. A copy is built in a staging folder, then renamed
into place whole, with a marker naming its content (the manifest's digest) written last; a
folder without a marker is never a copy. Eviction renames a copy out of the way before it is
removed, so that a half-removed copy is never taken for a whole one. A copy's last use is its
marker's modification time."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from argosy.operator.model_cache.agent.manifest import Manifest

MARKER = ".argosy-copy.json"
STAGING = ".staging"
TRASH = ".trash"


@dataclass(frozen=True)
class StoredCopy:
    key: str  # "namespace/name"
    digest: str  # the manifest's, whose files it holds
    size: int
    last_used: float


class CacheStore:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.root / TRASH, ignore_errors=True)  # what an agent stopped while removing left

    def folder(self, key: str) -> Path:
        return self.root / key

    def staging(self, key: str) -> Path:
        return self.root / STAGING / key

    def copy(self, key: str) -> StoredCopy | None:
        marker = self.folder(key) / MARKER
        try:
            record = json.loads(marker.read_text())
            return StoredCopy(key, record["digest"], int(record["size"]), marker.stat().st_mtime)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def copies(self) -> list[StoredCopy]:
        found = []
        for marker in self.root.glob(f"*/*/{MARKER}"):
            namespace, name = marker.parent.parent.name, marker.parent.name
            if not namespace.startswith("."):
                held = self.copy(f"{namespace}/{name}")
                if held is not None:
                    found.append(held)
        return found

    def staged_keys(self) -> list[str]:
        """Copies under way, or left by an agent that stopped."""
        return [f"{p.parent.name}/{p.name}" for p in (self.root / STAGING).glob("*/*") if p.is_dir()]

    def finish(self, key: str, manifest: Manifest) -> None:
        """The staged copy, whole and verified, into place (a copy already there goes)."""
        staging = self.staging(key)
        marker = staging / MARKER
        marker.write_text(json.dumps({"digest": manifest.digest, "size": manifest.total, "files": len(manifest.files)}))
        for path in staging.rglob("*"):
            if path.is_file():
                _fsync(path)
        _fsync(staging)
        target = self.folder(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            self._discard(target)
        os.rename(staging, target)
        _fsync(target.parent)

    def evict(self, key: str) -> None:
        target = self.folder(key)
        if target.exists():
            self._discard(target)

    def discard_staging(self, key: str) -> None:
        staging = self.staging(key)
        if staging.exists():
            self._discard(staging)

    def touch(self, key: str) -> None:
        """Marks the copy used now."""
        marker = self.folder(key) / MARKER
        if marker.exists():
            now = time.time()
            os.utime(marker, (now, now))

    def _discard(self, folder: Path) -> None:
        trash = self.root / TRASH / uuid.uuid4().hex
        trash.parent.mkdir(parents=True, exist_ok=True)
        os.rename(folder, trash)
        shutil.rmtree(trash, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
