"""A real uvicorn server on loopback, in a background thread of the test process, and a gate
that holds its engine loop so that a test can act while a request is certainly running."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.app import build_app
from argosy.server.api.serve_command import DrainingServer
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.engine_config import EngineConfig
from argosy.server.outputs import EngineStats
from tests.polling import wait_until
from tests.processes import MODEL, free_port


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

    @property
    def core(self):
        """The engine core the client drives in this process (the gate holds its steps)."""
        return self.state.client.core

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)

    def metric(self, name: str, **labels) -> float:
        """The value of one series from /metrics (0 if absent)."""
        want = {"model_name": self.state.model_name, **labels}
        for family in text_string_to_metric_families(httpx.get(f"{self.url}/metrics").text):
            for sample in family.samples:
                if sample.name == name and sample.labels == want:
                    return sample.value
        return 0.0

    def sigterm(self) -> None:
        """What SIGTERM does to `argosy serve`: start the drain."""
        self.uvicorn.handle_exit(signal.SIGTERM, None)


@contextmanager
def run_server(checkpoint, **settings) -> Iterator[RunningServer]:
    engine_settings = {k: settings.pop(k) for k in list(settings) if k in EngineConfig.__dataclass_fields__}
    engine_settings.setdefault("served_model_name", MODEL)
    engine_settings.setdefault("dtype", "float32")
    engine_settings.setdefault("kv_cache_memory", 8 << 20)
    engine = EngineConfig(model=str(checkpoint) if checkpoint else None, **engine_settings)
    config = ServerConfig(engine=engine, port=free_port(), **settings)
    app = build_app(config, load_in_background=False)
    state: ServerState = app.state.argosy
    server = DrainingServer(
        uvicorn.Config(app, host="127.0.0.1", port=config.port, log_config=None, access_log=False), state
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 60, "the server to become healthy")
        yield RunningServer(url, state, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


class EngineGate:
    """Holds the engine loop before a step while `hold(stats)` is true, until released:
    whatever the machine's speed, what runs then stays running and what waits stays waiting."""

    def __init__(self, engine, hold: Callable[[EngineStats], bool]):
        self._engine, self._step, self._hold = engine, engine.step, hold
        self._cond = threading.Condition()
        self._released = False
        self._holding = False

    def step(self):
        with self._cond:
            while not self._released and self._hold(self._engine.stats()):
                self._holding = True
                self._cond.notify_all()
                self._cond.wait()
            self._holding = False
        return self._step()

    def hold_when(self, hold: Callable[[EngineStats], bool]) -> None:
        """From now on, holds while `hold` is true (the loop steps until it is)."""
        with self._cond:
            self._hold, self._holding = hold, False
            self._cond.notify_all()

    def wait_holding(self) -> None:
        """Returns once the loop waits at the gate."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._holding, timeout=30):
                raise AssertionError("the engine loop never reached the gate")

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._cond.notify_all()


@contextmanager
def holding_engine(
    server: RunningServer, hold: Callable[[EngineStats], bool] = lambda stats: stats.num_running > 0
) -> Iterator[EngineGate]:
    """The server's engine loop held before each step while `hold` is true (by default: once
    a request is running); released when the block ends, so that the server can always stop."""
    engine = server.core
    gate = EngineGate(engine, hold)
    engine.step = gate.step
    try:
        yield gate
    finally:
        gate.release()
        del engine.step
