"""FileServer: the agent's read-only HTTP server of its cache root, from which other nodes'
agents copy (a ModelCache whose source is this node). GET (and HEAD) of a regular file under the
root, with a byte range where asked. Nothing is served that resolves outside the root or into
the agent's own folders (staging, trash) or hidden files, whatever symlinks lead there; every
malformed request gets a 4xx. A connection gets CONNECTION_TIMEOUT seconds for each read and
write, and at most MAX_CONNECTIONS are served at once (the rest get 503 at once), so that slow
or half-sent requests cannot hold threads for ever."""

from __future__ import annotations

import errno
import io
import os
import re
import shutil
import socket
import stat
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d{1,19})-$")
CONNECTION_TIMEOUT = 30.0  # seconds for a request to arrive, and for each write of the response
MAX_CONNECTIONS = 32
MAX_PATH_BYTES = 4096
BUSY = b"HTTP/1.0 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"
TIMED_OUT = b"HTTP/1.0 408 Request Timeout\r\nContent-Length: 0\r\n\r\n"


class FileServer:
    def __init__(
        self,
        root: Path,
        host: str = "0.0.0.0",
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = CONNECTION_TIMEOUT,
    ):
        handler = type("Handler", (_Handler,), {"root": Path(root).resolve(), "timeout": timeout})
        self.httpd = _BoundedServer((host, port), handler, max_connections)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="file-server", daemon=True)

    def start(self) -> FileServer:
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them."""

    daemon_threads = True

    def __init__(self, address, handler, max_connections: int):
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request: socket.socket, client_address) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes, every read given only what is left of the time the request has to
    arrive: a request trickled in a byte at a time is cut off all the same."""

    def __init__(self, sock: socket.socket, seconds: float):
        self.sock, self.seconds, self.timed_out = sock, seconds, False
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.timed_out = True
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(left)
        try:
            return self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        finally:
            self.sock.settimeout(self.seconds)  # the writes' own limit


class _Handler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0): nothing idles between requests."""

    root: Path
    timeout: float  # for the request to arrive, and for each write of the response
    default_request_version = "HTTP/1.0"  # a malformed request line gets a status line too, not HTTP/0.9's bare body

    def setup(self) -> None:
        super().setup()
        self.reader = _DeadlineReader(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.reader)

    def handle_one_request(self) -> None:
        super().handle_one_request()  # a request that timed out is closed there, unanswered
        if self.reader.timed_out:
            try:
                self.connection.settimeout(1.0)
                self.connection.sendall(TIMED_OUT)
            except OSError:
                pass

    def __getattr__(self, name: str):
        if name.startswith("do_"):  # any other method: 405, not the base class's 501
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, allow="GET, HEAD")

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _serve(self, body: bool) -> None:
        path, status = self._resolve()
        if path is None:
            return self._error(status)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the open
        except OSError:
            return self._error(HTTPStatus.NOT_FOUND)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            return self._error(HTTPStatus.NOT_FOUND)
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            size, asked = info.st_size, self.headers.get("Range")
            wanted = _RANGE.match(asked) if asked is not None else None
            if asked is not None and wanted is None:
                return self._error(HTTPStatus.BAD_REQUEST, "only Range: bytes=START- is served")
            start = int(wanted.group(1)) if wanted else 0
            if wanted and start >= size:
                return self._error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, content_range=f"bytes */{size}")
            self.send_response(HTTPStatus.PARTIAL_CONTENT if wanted else HTTPStatus.OK)
            self.send_header("Content-Length", str(size - start))
            self.send_header("Accept-Ranges", "bytes")
            if wanted:
                self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
            self.end_headers()
            if body:
                f.seek(start)
                shutil.copyfileobj(f, self.wfile, 1 << 20)

    def _resolve(self) -> tuple[Path | None, HTTPStatus]:
        """The file the request names, or None and the status that refuses it."""
        relative = unquote(urlsplit(self.path).path).lstrip("/")
        if "\0" in relative:
            return None, HTTPStatus.BAD_REQUEST
        if len(relative.encode(errors="surrogateescape")) > MAX_PATH_BYTES:
            return None, HTTPStatus.REQUEST_URI_TOO_LONG
        try:
            path = (self.root / relative).resolve()
        except OSError as exc:
            too_long = exc.errno == errno.ENAMETOOLONG
            return None, HTTPStatus.REQUEST_URI_TOO_LONG if too_long else HTTPStatus.NOT_FOUND
        except (ValueError, RuntimeError):  # a symlink loop
            return None, HTTPStatus.NOT_FOUND
        # Judged where the path leads, not as it was written: a link into staging is refused too.
        if not relative or not path.is_relative_to(self.root):
            return None, HTTPStatus.NOT_FOUND
        parts = path.relative_to(self.root).parts
        if not parts or any(p.startswith(".") for p in parts):
            return None, HTTPStatus.NOT_FOUND
        return path, HTTPStatus.OK

    def _error(self, status: HTTPStatus, message: str | None = None, **headers: str) -> None:
        body = f"{status.value} {message or status.phrase}\n".encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-").title(), value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        """Quiet: the agent logs copies, not each request."""
