"""What cache-aware routers ask a replica, as they ask vLLM: `GET /server_info` (and
`/get_server_info`, the vLLM router's name for it) with the served model, the KV cache's block
size and how its blocks are hashed; and `GET /kv_event_sources`, where the replica publishes its
KV-cache events (an empty map with events off), by data-parallel rank. The router takes a wildcard
host in an endpoint (`tcp://*:5557`) as the replica's own address."""

from __future__ import annotations

import dataclasses

from fastapi import FastAPI

from argosy.server.api.openapi_spec import errors
from argosy.server.api.server_state import ServerState
from argosy.server.engine.block_hash import BlockHasher
from argosy.server.kv_events.config import advertised

EVENTS_ENCODING = "msgpack"
EVENTS_SCHEMA_VERSION = 1  # vLLM's layout: [ts, events, data_parallel_rank], events tagged maps


def kv_cache_info(state: ServerState) -> dict:
    engine = state.config.engine
    hashing = BlockHasher.from_env(engine.prefix_caching_hash_algo).describe()
    return {"block_size": engine.block_size, "enable_prefix_caching": engine.enable_prefix_caching, **hashing}


def install_router_routes(app: FastAPI, state: ServerState) -> None:
    def server_info() -> dict:
        engine, cache = state.config.engine, kv_cache_info(state)
        events = engine.kv_events
        config = {
            "model_config": {"model": state.model_name, "served_model_name": state.model_name},
            "cache_config": cache,
            "kv_events_config": None if events is None else dataclasses.asdict(events),
            "parallel_config": {
                "tensor_parallel_size": engine.tensor_parallel_size,
                "pipeline_parallel_size": engine.pipeline_parallel_size,
                "data_parallel_size": 1,
            },
        }
        return {"vllm_config": config, "model": state.model_name, "block_size": engine.block_size}

    @app.get("/server_info", responses=errors(401))
    async def get_server_info() -> dict:
        """The served model and its KV cache's settings (block size, block hashes), as JSON."""
        return server_info()

    @app.get("/get_server_info", responses=errors(401), include_in_schema=False)
    async def get_server_info_alias() -> dict:
        return server_info()

    @app.get("/kv_event_sources", responses=errors(401))
    async def kv_event_sources() -> dict:
        """Where this replica publishes its KV-cache events, by data-parallel rank ({} with them off)."""
        events = state.config.engine.kv_events
        if events is None or not events.publishes:
            return {}
        bound = (None, None) if state.client is None else state.client.kv_events_bound or (None, None)
        replay = None if events.replay_endpoint is None else advertised(events.replay_endpoint, bound[1])
        source = {
            "endpoint": advertised(events.endpoint, bound[0]),
            "replay_endpoint": replay,
            "topic": events.topic,
            "hwm": events.hwm,
            "buffer_steps": events.buffer_steps,
            "publisher": events.publisher,
            "encoding": EVENTS_ENCODING,
            "schema_version": EVENTS_SCHEMA_VERSION,
            "enable_kv_cache_events": True,
        }
        return {"0": source}
