"""A real uvicorn server on loopback, in a background thread of the test process."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import pytest
import uvicorn

from argosy.server.api.app import build_app
from argosy.server.api.state import ServerConfig, ServerState
from argosy.server.config import EngineConfig
from tests.processes import MODEL, free_port, wait_until


@dataclass
class RunningServer:
    url: str
    state: ServerState

    @property
    def engine(self):
        return self.state.engine.engine

    def client(self, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=kwargs.pop("api_key", "unused"), max_retries=0, **kwargs)

    def metric(self, name: str, **labels) -> float:
        """The value of one series from /metrics (0 if absent)."""
        text = httpx.get(f"{self.url}/metrics").text
        want = {"model_name": self.state.model_name, **labels}
        for line in text.splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                series, value = line.rsplit(" ", 1)
                found = dict(p.split("=", 1) for p in series[len(name) + 1:-1].split(",")) if "{" in series else {}
                if {k: v.strip('"') for k, v in found.items()} == want:
                    return float(value)
        return 0.0


@contextmanager
def run_server(checkpoint, **settings) -> Iterator[RunningServer]:
    engine_settings = {k: settings.pop(k) for k in list(settings) if k in EngineConfig.__dataclass_fields__}
    engine_settings.setdefault("served_model_name", MODEL)
    engine_settings.setdefault("dtype", "float32")
    engine_settings.setdefault("kv_cache_memory", 8 << 20)
    engine = EngineConfig(model=str(checkpoint) if checkpoint else None, **engine_settings)
    config = ServerConfig(engine=engine, port=free_port(), **settings)
    app = build_app(config, load_in_background=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=config.port, log_config=None,
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{config.port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 60, "the server to become healthy")
        yield RunningServer(url, app.state.argosy)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def server(llama_checkpoint) -> Iterator[RunningServer]:
    with run_server(llama_checkpoint) as running:
        yield running
