"""A real uvicorn server on loopback, in a background thread of the test process, with its
engine core in a child process as under `argosy serve`; and a pause of that process, so that
a test can act while a request is certainly running."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.app import build_app
from argosy.server.api.serve_command import DrainingServer, uvicorn_config
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.engine_config import EngineConfig
from tests.polling import wait_until
from tests.processes import MODEL, free_port

# A server with every surface a client can change it through turned on (and priorities served),
# for the tests that attack them.
EVERY_SURFACE_ON = dict(
    scheduling_policy="priority",
    enable_weight_updates=True,
    enable_sleep_mode=True,
    enable_lora=True,
    allow_runtime_lora_updating=True,
)


@dataclass
class RunningServer:
    url: str
    state: ServerState
    uvicorn: DrainingServer
    thread: threading.Thread

    @property
    def engine(self):
        """The server's engine client: what the HTTP layer sees."""
        return self.state.client

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)

    def metric(self, name: str, **labels) -> float:
        return metric(self.url, name, self.state.model_name, **labels)

    def metrics(self, names: tuple[str, ...], **labels) -> dict[str, float]:
        return metrics(self.url, names, self.state.model_name, **labels)

    def sigterm(self) -> None:
        """What SIGTERM does to `argosy serve`: start the drain."""
        self.uvicorn.handle_exit(signal.SIGTERM, None)


def metric(url: str, name: str, model: str = MODEL, **labels) -> float:
    """The value of one series from a server's /metrics (0 if absent)."""
    return metrics(url, (name,), model, **labels)[name]


def metrics(url: str, names: tuple[str, ...], model: str = MODEL, **labels) -> dict[str, float]:
    """The values of several series (each 0 if absent) from one read of a server's /metrics."""
    want = {"model_name": model, **labels}
    values = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for sample in family.samples:
            if sample.name in values and sample.labels == want:
                values[sample.name] = sample.value
    return values


@contextmanager
def run_server(checkpoint, **settings) -> Iterator[RunningServer]:
    engine_settings = {k: settings.pop(k) for k in list(settings) if k in EngineConfig.__dataclass_fields__}
    engine_settings.setdefault("served_model_name", MODEL)
    engine_settings.setdefault("dtype", "float32")
    engine_settings.setdefault("kv_cache_memory", 8 << 20)
    engine = EngineConfig(model=str(checkpoint) if checkpoint else None, **engine_settings)
    settings.setdefault("port", free_port())
    config = ServerConfig(engine=engine, **settings)
    app = build_app(config)
    state: ServerState = app.state.argosy
    server = DrainingServer(uvicorn_config(app, config), state)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    scheme = "https" if config.ssl_certfile else "http"
    url = f"{scheme}://{config.host}:{config.port}"
    try:
        healthy = lambda: httpx.get(f"{url}/health", verify=False).status_code == 200  # noqa: E731
        wait_until(healthy, 60, "the server to become healthy")
        yield RunningServer(url, state, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def paused_core(server: RunningServer) -> Iterator[None]:
    """The server's engine core process stopped (SIGSTOP) until the block ends: whatever the
    machine's speed, what runs then stays running and what waits stays waiting, while the API
    process goes on answering. The figures the API reports are those of the core's last step."""
    os.kill(server.engine.core.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.engine.core.pid, signal.SIGCONT)


def stream_in_background(
    url: str, max_tokens: int, results: list, started: threading.Event | None = None, model: str = MODEL, **fields
) -> threading.Thread:
    """A streamed completion in a thread: its server-sent events' data go into `results` (one
    list per stream) once it ends; `started` is set at its first event. `fields`: more of the body."""

    def run() -> None:
        body = {"model": model, "prompt": "once upon a time", "max_tokens": max_tokens, "stream": True, **fields}
        events = []
        with httpx.stream("POST", f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if started is not None:
                        started.set()
        results.append(events)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def send_without_reading(url: str, path: str, body: dict, receive_buffer: int | None = None) -> socket.socket:
    """A client that sends a request and then only holds the connection open, with a receive
    buffer of `receive_buffer` bytes if given (the kernel's default otherwise)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    if receive_buffer is not None:  # before connecting: it sets the TCP window offered
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def timed_while(thread: threading.Thread, call: Callable[[], object]) -> list[float]:
    """Starts `thread` and times `call`, again and again, until the thread ends: how long each
    took (at least one, timed after the thread ended if it was that quick)."""
    latencies: list[float] = []
    thread.start()
    while thread.is_alive() or not latencies:
        started = time.monotonic()
        call()
        latencies.append(time.monotonic() - started)
    thread.join()
    return latencies
