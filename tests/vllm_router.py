"""The real vLLM router (the `vllm-router` package) run on loopback for a test: its arguments as
given, its own free ports, debug logs in a file the test can read."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.polling import wait_until
from tests.processes import free_port

ANSI = re.compile(r"\x1b\[[0-9;]*m")
needs_router = pytest.mark.skipif(
    shutil.which("vllm-router") is None, reason="the vllm-router package is part of the test extra"
)


@dataclass
class Router:
    url: str
    process: subprocess.Popen
    log_file: Path

    def log(self) -> str:
        return ANSI.sub("", self.log_file.read_text())


@contextmanager
def running_router(log_file: Path, *args: str) -> Iterator[Router]:
    port = free_port()
    command = [shutil.which("vllm-router"), "--host", "127.0.0.1", "--port", str(port),
               "--prometheus-port", str(free_port()), "--health-check-interval-secs", "1", "--log-level", "debug",
               *args]  # fmt: skip
    process = subprocess.Popen(command, stdout=log_file.open("w"), stderr=subprocess.STDOUT)
    router = Router(f"http://127.0.0.1:{port}", process, log_file)
    try:
        wait_until(lambda: _up(router.url), 60, "the router to answer")
        yield router
    finally:
        process.terminate()
        process.wait(10)


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
