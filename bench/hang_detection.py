"""How long a hung engine core goes unnoticed: `argosy serve` (the default model) with its core
stopped by SIGSTOP, busy (a stream in flight) and idle, at each --engine-step-timeout.

    python bench/hang_detection.py [--timeouts 10 120]

Prints, per case, the seconds from the stop to the client's error event (busy only), to /live
turning 503, and to the server's exit, and the exit code. Busy, the bound is the timeout plus
the watchdog's poll (a tenth of it, at most 1 s); idle, plus the ping interval (a quarter of
it, at most 5 s) before the unanswered ping."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

MODEL = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(timeout: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-P", "-m", "argosy", "serve", "--served-model-name", MODEL, "--port", str(port)]
    server = subprocess.Popen(
        [*command, "--engine-step-timeout", str(timeout), "--log-format", "text"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.kill()
    raise SystemExit("the server did not become healthy")


def core_pid(server: subprocess.Popen) -> int:
    (pid,) = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
    return int(pid)


def stream_until_error(url: str, first: threading.Event, errored: list[float]) -> None:
    body = {"model": MODEL, "prompt": "Tell me a long story.", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=None) as response:
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            first.set()
            if "error" in json.loads(line[6:]):
                errored.append(time.monotonic())


def measure(timeout: float, busy: bool) -> dict[str, float | int | None]:
    server, url = start_server(timeout)
    errored: list[float] = []
    try:
        if busy:
            first = threading.Event()
            threading.Thread(target=stream_until_error, args=(url, first, errored), daemon=True).start()
            first.wait(60)
        os.kill(core_pid(server), signal.SIGSTOP)
        stopped = time.monotonic()
        live = None
        while server.poll() is None:
            try:
                if live is None and httpx.get(f"{url}/live", timeout=1).status_code == 503:
                    live = time.monotonic() - stopped
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        return {
            "error": errored[0] - stopped if errored else None,
            "live": live,
            "exit": time.monotonic() - stopped,
            "code": server.returncode,
        }
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[10.0, 120.0])
    args = parser.parse_args()
    print("| --engine-step-timeout | core | client's error after | /live 503 after | exit after | exit code |")
    print("|---|---|---|---|---|---|")
    for timeout in args.timeouts:
        for busy in (True, False):
            row = measure(timeout, busy)
            error = f"{row['error']:.1f} s" if row["error"] is not None else "—"
            live = f"{row['live']:.1f} s" if row["live"] is not None else "—"
            state = "busy (a stream)" if busy else "idle"
            print(f"| {timeout:g} s | {state} | {error} | {live} | {row['exit']:.1f} s | {row['code']} |", flush=True)


if __name__ == "__main__":
    main()
