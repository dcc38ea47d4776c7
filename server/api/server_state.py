"""ServerState: what the routes share (the configuration, the metrics, the engine once loaded,
whether the server drains, and the failure that ends it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from argosy.server.api.adapters import ServedAdapters
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.weights import WeightsControl
from argosy.server.exceptions import NotFoundError
from argosy.server.lora.request import AdapterRef
from argosy.server.tools.chat_format import ChatFormat


@dataclass
class ServerState:
    config: ServerConfig
    metrics: ServerMetrics
    client: EngineClient | None = None  # set once the model is loaded
    adapters: ServedAdapters | None = None  # with LoRA on, once the model is loaded
    chat_format: ChatFormat | None = None  # once the tokenizer is read
    weights: WeightsControl = field(default_factory=WeightsControl)
    failure: str | None = None  # why the server must exit: the model did not load, or the core died
    exit_code: int = 0  # of `argosy serve`, set with `failure`
    draining: bool = False
    responses_in_flight: int = 0  # HTTP responses not yet wholly sent (kept by ResponsesInFlight)

    def fail(self, reason: str, exit_code: int) -> None:
        self.failure, self.exit_code = reason, exit_code

    @property
    def model_name(self) -> str:
        return self.config.model_name

    def resolve_model(self, model: str) -> AdapterRef | None:
        """The adapter a request's `model` names (None: the base model); 404 for any other name."""
        if model == self.model_name:
            return None
        ref = None if self.adapters is None else self.adapters.registry.get(model)
        if ref is None:
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")
        return ref

    @property
    def idle(self) -> bool:
        """No engine request in flight and no response still being sent: a drain may end."""
        return (self.client is None or self.client.num_in_flight == 0) and self.responses_in_flight == 0

    @property
    def live(self) -> bool:
        """False once the engine core is dead or hung: only a restart helps."""
        return self.client is None or self.client.healthy

    @property
    def ready(self) -> bool:
        awake = self.weights.sleeping is None
        return self.client is not None and self.live and self.failure is None and not self.draining and awake

    @property
    def unready_reason(self) -> str:
        if self.client is not None and self.client.dead is not None:
            return self.client.dead
        if self.weights.sleeping is not None:
            return f"asleep (level {self.weights.sleeping})"
        return "draining" if self.draining else self.failure or "loading"
