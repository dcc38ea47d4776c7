"""ServerConfig (every flag of `argosy serve`) and ServerState (what the routes share)."""
from __future__ import annotations

from dataclasses import dataclass

from argosy.server.api.engine_client import AsyncEngine
from argosy.server.api.metrics import ServerMetrics
from argosy.server.engine_config import EngineConfig
from argosy.server.models.default_model import DEFAULT_MODEL_NAME


@dataclass
class ServerConfig:
    engine: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_waiting_requests: int = 1024
    shutdown_timeout: float = 60.0
    max_request_body_bytes: int = 8 << 20
    log_format: str = "json"

    @property
    def model_name(self) -> str:
        return self.engine.served_model_name or self.engine.model or DEFAULT_MODEL_NAME


@dataclass
class ServerState:
    config: ServerConfig
    metrics: ServerMetrics
    engine: AsyncEngine | None = None  # set once the model is loaded
    load_error: str | None = None
    draining: bool = False

    @property
    def model_name(self) -> str:
        return self.config.model_name

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.engine.healthy and not self.draining
