"""Starting a server for a benchmark: on a free loopback port, ready once its health check
answers 200, stopped when the benchmark is done; or several at once, each one thread, logging to a
file."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running(
    command: list[str], port: int, health_path: str = "/health", timeout: float = 300, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Runs `command` (which listens on `port`) until the block ends; yields its base URL."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, timeout, health_path)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


def start(command: list[str], log: Path) -> subprocess.Popen:
    # One thread each: the replicas share the machine's cores, as pods share nothing but the network.
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(command, stdout=log.open("a"), stderr=subprocess.STDOUT, env=env)


def wait_healthy(url: str, process: subprocess.Popen, timeout: float = 300, health_path: str = "/health") -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not come up (exit {process.poll()})")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + health_path, timeout=2).status_code == 200:
                return
        time.sleep(0.5)


def stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
