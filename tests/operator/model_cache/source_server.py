"""A real HTTP server on loopback serving a folder as a model store would (byte ranges, an
optional bearer token), with faults a test can ask for: a file's first answer corrupted, a
connection cut after some bytes, every answer slowed. It records what it was asked."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class Faults:
    corrupt_once: set[str] = field(default_factory=set)  # files whose next answer has a byte flipped
    cut_once: dict[str, int] = field(default_factory=dict)  # files whose next answer stops after N bytes
    seconds_per_mib: float = 0.0  # a slow link
    token: str | None = None  # when set, requests without it get 401


@dataclass
class Served:
    path: str
    range: str | None
    bytes: int


class SourceServer:
    def __init__(self, folder: Path, faults: Faults | None = None):
        self.folder, self.faults = folder, faults or Faults()
        self.served: list[Served] = []
        self.lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"server_state": self})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def bytes_served(self, path: str) -> int:
        return sum(s.bytes for s in self.served if s.path == path)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    server_state: SourceServer

    def do_GET(self) -> None:
        state, faults = self.server_state, self.server_state.faults
        relative = unquote(urlsplit(self.path).path).lstrip("/")
        if faults.token and self.headers.get("Authorization") != f"Bearer {faults.token}":
            return self.send_error(HTTPStatus.UNAUTHORIZED)
        file = state.folder / relative
        if not file.is_file():
            return self.send_error(HTTPStatus.NOT_FOUND)
        data = file.read_bytes()
        asked = self.headers.get("Range")
        start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1)) if asked else 0
        body = data[start:]
        with state.lock:
            corrupt = relative in faults.corrupt_once and not faults.corrupt_once.discard(relative)
            cut = faults.cut_once.pop(relative, None)
        if corrupt and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(HTTPStatus.PARTIAL_CONTENT if asked else HTTPStatus.OK)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        sent = body if cut is None else body[:cut]
        for i in range(0, len(sent), 1 << 16):
            self.wfile.write(sent[i : i + (1 << 16)])
            time.sleep(faults.seconds_per_mib / 16)
        with state.lock:
            state.served.append(Served(relative, asked, len(sent)))
        if cut is not None:
            self.close_connection = True  # the client sees the body end early

    def log_message(self, format: str, *args) -> None:
        """Quiet."""
