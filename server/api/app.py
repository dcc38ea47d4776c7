"""The FastAPI application: routes, and the engine core's process started in the background
(so /health can say 503 while the model loads, and once the core is gone)."""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from argosy.server.api.adapters import AdaptersFileWatcher, ServedAdapters, startup_adapters
from argosy.server.api.chat import create_chat_completion
from argosy.server.api.completions import create_completion
from argosy.server.api.core_client import CoreClient
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.error_responses import install_error_handlers, retry_later
from argosy.server.api.lora_routes import install_lora_routes
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.middleware import APIKeyCheck, BodyLimits, JSONBodies, ResponsesInFlight
from argosy.server.api.openapi_spec import (
    BODY_ERRORS,
    HEALTH_RESPONSES,
    LIVE_RESPONSES,
    METRICS_RESPONSES,
    errors,
    generation_responses,
    install_openapi,
)
from argosy.server.api.protocol import ChatCompletionRequest, CompletionRequest
from argosy.server.api.request_log import RequestLog
from argosy.server.api.router_routes import install_router_routes, kv_cache_info
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.api.tokenize_routes import install_tokenize_routes
from argosy.server.api.weight_routes import install_weight_routes
from argosy.server.engine.input_processor import InputProcessor
from argosy.server.exceptions import ArgosyError
from argosy.server.interface import HEALTH_PATH, LIVE_PATH, METRICS_PATH
from argosy.server.responses.routes import install_responses_routes
from argosy.server.responses.store import ResponseStore
from argosy.server.tools.chat_format import ChatFormat

log = logging.getLogger("argosy.api")
ENGINE_DIED_EXIT_CODE = 70  # sysexits' EX_SOFTWARE: the engine core process died or hung


async def run_engine(state: ServerState) -> None:
    """Starts the engine core's process, serves through it until it ends, and records why the
    server must exit if the model fails to load or the core dies."""
    config = state.config
    core: CoreClient | None = None
    try:
        inputs = await asyncio.to_thread(InputProcessor.for_model, config.engine)
        state.chat_format = ChatFormat.for_model(config.chat_template, config.tool_call_parser, inputs.tokenizer)
        registry = await asyncio.to_thread(startup_adapters, config)
        core = CoreClient(config.engine, config.log_format)
        ready = await core.wait_ready()
    except ArgosyError as exc:  # CoreStartError included
        log.error("model failed to load: %s", exc)
        if core is not None:
            await core.shutdown()
        return state.fail(str(exc), exc.exit_code)
    except asyncio.CancelledError:  # the server stops while the model loads
        if core is not None:
            await core.shutdown(kill=True)
        raise
    try:
        client = EngineClient(
            core,
            inputs,
            ready,
            config.max_waiting_requests,
            state.metrics,
            config.stream_limits,
            config.engine_step_timeout,
        )
        state.metrics.bind_gauges(
            lambda: client.num_waiting,
            lambda: client.num_running,
            lambda: client.stats().kv_cache_usage,
            lambda: client.watchdog.stalled_seconds(time.monotonic()),
        )
        state.metrics.describe_cache(
            config.engine.block_size, ready.stats.kv_blocks_total, config.engine.enable_prefix_caching
        )
        if registry is not None:
            adapters = ServedAdapters(registry, client.load_adapter, client.retire_adapter)
            for ref in registry.refs.values():
                client.load_adapter(ref)
            state.metrics.bind_lora(lambda: client.stats().lora)
            state.adapters = adapters
        log.info(
            "model %s loaded: %s blocks of %s tokens; engine core pid %s",
            state.model_name,
            ready.stats.kv_blocks_total,
            config.engine.block_size,
            core.pid,
        )
    except Exception as exc:  # a bug between the core's start and serving: exit, never hang as "loading"
        log.exception("starting to serve failed")
        await core.shutdown(kill=True)
        return state.fail(f"starting to serve failed: {type(exc).__name__}: {exc}", ENGINE_DIED_EXIT_CODE)
    if config.enable_log_requests:
        client.request_log = RequestLog(config.max_log_len)
    state.client = client
    watcher = None
    if config.lora_config_file and state.adapters is not None:
        watch = AdaptersFileWatcher(config.lora_config_file, state.adapters, state.metrics.count_lora_config_error)
        watcher = asyncio.create_task(watch.run())
    try:
        await client.run()  # guards its own loop: any failure there ends in client.dead
    finally:
        if watcher is not None:
            watcher.cancel()
    if client.dead is not None:
        state.fail(client.dead, ENGINE_DIED_EXIT_CODE)


def build_app(config: ServerConfig) -> FastAPI:
    state = ServerState(config, ServerMetrics(config.model_name))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine = asyncio.create_task(run_engine(state))
        yield
        if state.client is not None:
            await state.client.shutdown()
        engine.cancel()
        await asyncio.gather(engine, return_exceptions=True)

    app = FastAPI(title="Argosy", lifespan=lifespan)
    app.state.argosy = state
    install_error_handlers(app)
    install_openapi(app)
    app.add_middleware(BodyLimits, max_bytes=config.max_request_body_bytes, timeout=config.body_timeout)
    app.add_middleware(JSONBodies)
    if config.api_key:
        app.add_middleware(APIKeyCheck, key=config.api_key)
    if config.allowed_origins:  # no origin is allowed unless named: a page elsewhere cannot call the API
        app.add_middleware(  # outside the key check: a browser's preflight carries no key
            CORSMiddleware,
            allow_origins=config.allowed_origins,
            allow_methods=config.allowed_methods,
            allow_headers=config.allowed_headers,
            allow_credentials=config.allow_credentials,
        )
    app.add_middleware(ResponsesInFlight, state=state)  # the outermost: it sees every response

    def loaded_engine() -> EngineClient:
        """The engine, loaded and alive, unless the server drains."""
        if state.draining:
            raise retry_later("the server is shutting down", "shutting_down")
        if state.client is None or state.failure is not None:
            raise retry_later(state.failure or "the model is loading", "model_not_ready")
        return state.client

    def serving_engine(client: EngineClient = Depends(loaded_engine)) -> EngineClient:
        """The engine, admitting requests: not asleep, no weight change under way (checked again
        when a call's requests are submitted)."""
        if client.unavailable is not None:
            raise retry_later(client.unavailable, "weights_unavailable")
        return client

    @app.get(HEALTH_PATH, response_class=Response, responses=HEALTH_RESPONSES)
    async def health() -> Response:
        """Readiness: the engine can serve now (loaded, its core neither dead nor hung, not draining)."""
        if state.ready:
            return Response(status_code=200)
        return JSONResponse({"status": state.unready_reason}, status_code=503)

    @app.get(LIVE_PATH, response_class=Response, responses=LIVE_RESPONSES)
    async def live() -> Response:
        """Liveness: the server can still recover by itself (loading, serving or draining); 503
        once its engine core is dead or hung."""
        return Response(status_code=200 if state.live else 503)

    @app.get(METRICS_PATH, response_class=Response, responses=METRICS_RESPONSES)
    async def metrics() -> Response:
        """Prometheus metrics: argosy_* and vLLM's names (the docs' metrics reference)."""
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models", responses=errors(401, 503))
    async def models(client: EngineClient = Depends(serving_engine)) -> dict:
        """The base model, and each adapter with its base as `parent` and its folder as `root`."""

        def card(name: str, root: str, parent: str | None) -> dict:
            return {
                "id": name,
                "object": "model",
                "created": 0,
                "owned_by": "argosy",
                "root": root,
                "parent": parent,
                "max_model_len": client.max_model_len,
            }

        base = card(state.model_name, state.model_name, None)  # never the server's own paths
        base["weight_version"] = state.weights.version
        refs = [] if state.adapters is None else sorted(state.adapters.registry.refs.values(), key=lambda r: r.name)
        cards = [base, *(card(r.name, r.path, state.model_name) for r in refs)]
        cache = kv_cache_info(state)  # how a consumer of KV events hashes tokens itself
        for model, ref in zip(cards, [None, *refs]):
            model["kv_cache"] = {**cache, "hash_seed": "" if ref is None else ref.digest}
        return {"object": "list", "data": cards}

    install_lora_routes(app, state, serving_engine)
    install_weight_routes(app, state, loaded_engine)
    install_tokenize_routes(app, state, loaded_engine)
    install_router_routes(app, state)
    store = ResponseStore(
        config.responses_store_entries,
        config.responses_store_bytes,
        config.responses_store_ttl,
        state.metrics.registry,
        config.model_name,
    )
    install_responses_routes(app, state, store, serving_engine)

    @app.post("/v1/completions", responses=generation_responses())
    async def completions(body: CompletionRequest, request: Request, client: EngineClient = Depends(serving_engine)):
        """OpenAI completions: a prompt (text or token ids) in, choices out; server-sent events with stream."""
        return await create_completion(body, request, state, client)

    @app.post("/v1/chat/completions", responses=generation_responses())
    async def chat(body: ChatCompletionRequest, request: Request, client: EngineClient = Depends(serving_engine)):
        """OpenAI chat completions through the checkpoint's chat template: tools, structured outputs, streaming."""
        return await create_chat_completion(body, request, state, client)

    @app.post("/v1/completions/render", responses=errors(*BODY_ERRORS))
    async def completions_render(body: CompletionRequest, request: Request, client=Depends(serving_engine)):
        """What a completions call would hand the engine, one entry per prompt: token ids and the resolved
        sampling limits (vLLM's render; routers tokenize through it). Nothing runs."""
        return await create_completion(body, request, state, client, render=True)

    @app.post("/v1/chat/completions/render", responses=errors(*BODY_ERRORS))
    async def chat_render(body: ChatCompletionRequest, request: Request, client=Depends(serving_engine)):
        """What a chat call would hand the engine: the rendered conversation's token ids and the resolved
        sampling limits (vLLM's render). Nothing runs."""
        return await create_chat_completion(body, request, state, client, render=True)

    return app
