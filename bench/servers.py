"""Starting a server for a benchmark: on a free loopback port, ready once its health check
answers 200, stopped when the benchmark is done."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(command: list[str], port: int, health_path: str = "/health", timeout: float = 300) -> Iterator[str]:
    """Runs `command` (which listens on `port`) until the block ends; yields its base URL."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{command[0]} did not start (exit {proc.poll()})")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + health_path).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)
