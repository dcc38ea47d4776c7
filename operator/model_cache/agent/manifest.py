"""Manifest: the files of a copy with their sizes and SHA-256, given inline in the ModelCache or
read from the source (as `argosy agent manifest FOLDER` writes it), and its digest, which names
the content a ready copy holds."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pydantic import TypeAdapter, ValidationError

from argosy.operator.model_cache.spec import CacheFile

READ_BYTES = 8 << 20
_FILES = TypeAdapter(list[CacheFile])


class ManifestError(Exception):
    """A manifest that cannot be used; the message says why."""


@dataclass(frozen=True)
class Manifest:
    files: tuple[CacheFile, ...]

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def digest(self) -> str:
        entries = sorted((f.path, f.size, f.sha256) for f in self.files)
        return hashlib.sha256(json.dumps(entries).encode()).hexdigest()

    @classmethod
    def of(cls, files: list[CacheFile]) -> Manifest:
        paths = [f.path for f in files]
        for path in paths:
            parts = PurePosixPath(path).parts
            if path.startswith("/") or ".." in parts or not parts or parts[0].startswith(".argosy"):
                raise ManifestError(f"file path {path!r} must be relative, inside the copy")
        if len(set(paths)) != len(paths):
            raise ManifestError("the manifest names a file twice")
        return cls(tuple(files))

    @classmethod
    def from_json(cls, text: bytes | str) -> Manifest:
        try:
            files = _FILES.validate_python(json.loads(text)["files"])
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            raise ManifestError(f"not a manifest ({str(exc).splitlines()[0]})") from exc
        return cls.of(files)

    def to_json(self) -> str:
        return json.dumps({"files": [f.model_dump() for f in self.files]}, indent=1)


def file_sha256(path: Path, on_bytes=None) -> str:
    """The file's SHA-256; `on_bytes(count)` after each read, for progress."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(READ_BYTES):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def folder_manifest(folder: Path) -> Manifest:
    """Every file under `folder` (hidden ones aside), with its size and SHA-256."""
    files = [
        CacheFile(path=path.relative_to(folder).as_posix(), size=path.stat().st_size, sha256=file_sha256(path))
        for path in sorted(folder.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(folder).parts)
    ]
    return Manifest.of(files)
