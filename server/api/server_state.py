"""ServerState: what the routes share (the configuration, the metrics, the engine once loaded,
whether the server drains)."""

from __future__ import annotations

from dataclasses import dataclass

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.server_config import ServerConfig


@dataclass
class ServerState:
    config: ServerConfig
    metrics: ServerMetrics
    client: EngineClient | None = None  # set once the model is loaded
    load_error: str | None = None
    exit_code: int = 0  # of `argosy serve`, set when the model fails to load
    draining: bool = False

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def ready(self) -> bool:
        return self.client is not None and self.client.healthy and not self.draining
