"""Where a copy's bytes come from: an HTTP(S) base URL (an object store, a model hub, or another
node's agent), or a folder the agent sees (a library claim it mounts). Each reads a file from
an offset, so that a copy resumes where it stopped."""

from __future__ import annotations

import http.client
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

CHUNK_BYTES = 1 << 20
TIMEOUT_SECONDS = 60  # without a byte for this long, the read fails and is retried


class FetchError(Exception):
    """A copy that failed, with a CamelCase reason, to be retried later."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason, self.message = reason, message


class FileSource(Protocol):
    def read(self, path: str, offset: int) -> tuple[int, Iterator[bytes]]:
        """The file's bytes from `offset`, or, where the source cannot resume, from 0: (where
        they start, the bytes)."""
        ...


def read_whole(source: FileSource, path: str) -> bytes:
    return b"".join(source.read(path, 0)[1])


@dataclass(frozen=True)
class HttpSource:
    base_url: str
    token: str | None = None

    def url(self, path: str) -> str:
        return f"{self.base_url.rstrip('/')}/{urllib.parse.quote(path)}"

    def read(self, path: str, offset: int) -> tuple[int, Iterator[bytes]]:
        request = urllib.request.Request(self.url(path))
        if offset:
            request.add_header("Range", f"bytes={offset}-")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            response = urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS)
        except urllib.error.HTTPError as exc:
            reason = "SourceNotFound" if exc.code == 404 else "SourceError"
            raise FetchError(reason, f"GET {request.full_url}: {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise FetchError("SourceUnreachable", f"GET {request.full_url}: {exc}") from exc
        start = offset if response.status == 206 else 0  # a server that ignores Range sends it all
        return start, _chunks(response, request.full_url)


def _chunks(response, url: str) -> Iterator[bytes]:
    with response:
        try:
            while chunk := response.read(CHUNK_BYTES):
                yield chunk
        except (OSError, http.client.HTTPException) as exc:  # a connection cut midway
            raise FetchError("SourceUnreachable", f"GET {url}: {exc!r}") from exc


@dataclass(frozen=True)
class FolderSource:
    folder: Path

    def read(self, path: str, offset: int) -> tuple[int, Iterator[bytes]]:
        file = self.folder / path
        try:
            handle = open(file, "rb")  # noqa: SIM115 (closed by the generator)
        except FileNotFoundError as exc:
            raise FetchError("SourceNotFound", f"{file}: no such file") from exc
        except OSError as exc:
            raise FetchError("SourceError", f"{file}: {exc}") from exc
        handle.seek(offset)
        return offset, _file_chunks(handle)


def _file_chunks(handle) -> Iterator[bytes]:
    with handle:
        while chunk := handle.read(CHUNK_BYTES):
            yield chunk
