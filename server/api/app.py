"""The FastAPI application: routes, and the background loading of the model (so /health can
say 503 while it loads)."""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from argosy.server.api.chat import create_chat_completion
from argosy.server.api.completions import create_completion
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.error_responses import RETRY_AFTER_SECONDS, APIError, install_error_handlers
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.middleware import APIKeyCheck, BodySizeLimit
from argosy.server.api.protocol import ChatCompletionRequest, CompletionRequest
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.engine.llm_engine import LLMEngine
from argosy.server.exceptions import ArgosyError

log = logging.getLogger("argosy.api")


def load_engine(state: ServerState) -> None:
    """Loads the model and starts the engine loop; failures are kept for /health and the CLI."""
    try:
        core = LLMEngine(state.config.engine)
    except Exception as exc:
        log.exception("model failed to load")
        state.load_error = str(exc)
        state.exit_code = exc.exit_code if isinstance(exc, ArgosyError) else 1
        return
    metrics = state.metrics

    def on_step(outputs, now) -> None:  # on the engine thread, after each step
        metrics.observe_step(outputs, now)
        stats = core.stats()
        metrics.sync_engine_counters(stats.num_preemptions, stats.prefix_cache_queries, stats.prefix_cache_hits)

    client = EngineClient(core, state.config.max_waiting_requests, on_step, metrics.observe_abort)
    metrics.bind_gauges(lambda: client.num_waiting, lambda: client.num_running, lambda: client.stats().kv_cache_usage)
    state.client = client
    log.info(
        "model %s loaded: %s blocks of %s tokens",
        state.model_name,
        client.stats().kv_blocks_total,
        state.config.engine.block_size,
    )


def build_app(config: ServerConfig, load_in_background: bool = True) -> FastAPI:
    state = ServerState(config, ServerMetrics(config.model_name))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if load_in_background:
            threading.Thread(target=load_engine, args=(state,), name="argosy-load", daemon=True).start()
        else:
            load_engine(state)
        yield
        if state.client is not None:
            state.client.shutdown()

    app = FastAPI(title="Argosy", lifespan=lifespan)
    app.state.argosy = state
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, limit=config.max_request_body_bytes)
    if config.api_key:
        app.add_middleware(APIKeyCheck, key=config.api_key)

    def serving_engine() -> EngineClient:
        if state.draining:
            raise APIError(
                503,
                "the server is shutting down",
                "service_unavailable_error",
                code="shutting_down",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        if state.client is None:
            raise APIError(
                503,
                state.load_error or "the model is loading",
                "service_unavailable_error",
                code="model_not_ready",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        return state.client

    @app.get("/health")
    async def health() -> Response:
        if state.ready:
            return Response(status_code=200)
        reason = (
            "draining"
            if state.draining
            else state.load_error or ("engine loop stopped" if state.client is not None else "loading")
        )
        return JSONResponse({"status": reason}, status_code=503)

    @app.get("/live")
    async def live() -> Response:
        """Liveness: the process answers (and its engine loop runs), draining or not."""
        healthy = state.client is None or state.client.healthy
        return Response(status_code=200 if healthy else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models(client: EngineClient = Depends(serving_engine)) -> dict:
        return {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "argosy",
                    "max_model_len": client.max_model_len,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, client: EngineClient = Depends(serving_engine)):
        return await create_completion(body, request, state, client)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request, client: EngineClient = Depends(serving_engine)):
        return await create_chat_completion(body, request, state, client)

    return app
