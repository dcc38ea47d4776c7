"""FileServer: the agent's read-only HTTP server of its cache root, from which other nodes'
agents copy (a ModelCache whose source is this node). GET of a file under the root, with a
byte range where asked; the agent's own folders (staging, trash) and hidden files are not
served, and nothing outside the root is."""

from __future__ import annotations

import re
import shutil
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-$")


class FileServer:
    def __init__(self, root: Path, host: str = "0.0.0.0", port: int = 0):
        handler = type("Handler", (_Handler,), {"root": Path(root).resolve()})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="file-server", daemon=True)

    def start(self) -> FileServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Handler(BaseHTTPRequestHandler):
    root: Path

    def do_GET(self) -> None:
        relative = unquote(urlsplit(self.path).path).lstrip("/")
        path = (self.root / relative).resolve()
        parts = Path(relative).parts
        if not parts or any(p.startswith(".") for p in parts) or not path.is_relative_to(self.root):
            return self.send_error(HTTPStatus.NOT_FOUND)
        if not path.is_file():
            return self.send_error(HTTPStatus.NOT_FOUND)
        size = path.stat().st_size
        wanted = _RANGE.match(self.headers.get("Range", ""))
        start = int(wanted.group(1)) if wanted else 0
        if start > size:
            return self.send_error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
        self.send_response(HTTPStatus.PARTIAL_CONTENT if wanted else HTTPStatus.OK)
        self.send_header("Content-Length", str(size - start))
        if wanted:
            self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
        self.end_headers()
        with open(path, "rb") as f:
            f.seek(start)
            shutil.copyfileobj(f, self.wfile, 1 << 20)

    def log_message(self, format: str, *args) -> None:
        """Quiet: the agent logs copies, not each request."""
