"""Real servers on loopback for the tests: free ports, and processes (`argosy serve`,
Prometheus) that run until the block ends."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

from tests.polling import wait_until

MODEL = "tiny"  # the name the test servers serve their checkpoint under


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command's name (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def process_group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    pids = (int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit())
    return [pid for pid in pids if (stat := _stat(pid)) is not None and int(stat[2]) == pgid and alive(pid)]


def free_port(avoid: tuple[int, ...] = ()) -> int:
    """A port free now, none of `avoid` (ports a server will bind later, which are free now too)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in avoid:
            return port


def free_port_pair() -> int:
    """A port free now whose next is free too: a master port, and the node link beside it."""
    while True:
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


@dataclass
class Process:
    popen: subprocess.Popen
    url: str
    log: IO[str]

    def output(self) -> str:
        """What the process printed so far (into a file: a pipe nobody reads would block it)."""
        self.log.seek(0)
        return self.log.read()


@contextmanager
def running(
    command: list[str],
    url: str,
    ready_path: str,
    what: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    wait: float = 60,
) -> Iterator[Process]:
    """A real process until the block ends; it is ready once url + ready_path answers 200
    (within `wait` seconds)."""
    with tempfile.TemporaryFile("w+") as log:
        popen = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd)
        proc = Process(popen, url, log)
        try:
            try:
                wait_until(lambda: httpx.get(url + ready_path).status_code == 200, wait, what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; it printed:\n{proc.output()[-4000:]}") from None
            yield proc
        finally:
            proc.popen.terminate()
            proc.popen.wait(30)


def serve_command(checkpoint, port: int, *flags: str) -> list[str]:
    """The `argosy serve` command line of the test servers: float32, a small byte-budget cache."""
    model = ["--model", str(checkpoint), "--served-model-name", MODEL, "--port", str(port)]
    settings = ["--dtype", "float32", "--kv-cache-memory", str(8 << 20), "--log-format", "text"]
    return [sys.executable, "-P", "-m", "argosy", "serve", *model, *settings, *flags]


@contextmanager
def serve_process(checkpoint, *flags: str, env: dict[str, str] | None = None) -> Iterator[Process]:
    """`argosy serve` on a test checkpoint, in its own process, as a pod would run it."""
    port = free_port()
    with running(
        serve_command(checkpoint, port, *flags),
        f"http://127.0.0.1:{port}",
        "/health",
        "the server to become healthy",
        env=env,
    ) as proc:
        yield proc
