"""Weights that change while serving, for a reinforcement-learning loop on the same machine:
`POST /v1/update_weights_from_disk` (with --enable-weight-updates) and sleep mode (with
--enable-sleep-mode): `POST /sleep?level=1|2`, `POST /wake_up`, `GET /is_sleeping`, all
behind the API key.

An update stops admitting (new requests get 503 and Retry-After), waits for the requests in
flight to finish (mode "wait") or aborts them (mode "abort", their finish_reason "abort"), then
has the engine core read the checkpoint into a staging copy, check it against the running model
and swap it in, all or nothing: on any error it answers 400 and the old weights keep serving.
A second update meanwhile gets 409. Sleep drains the same way, then frees the KV cache (level 1)
and the weights too (level 2); while asleep /health and new requests answer 503."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from fastapi import Depends, FastAPI, Query
from pydantic import BaseModel, ConfigDict

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.error_responses import APIError
from argosy.server.api.openapi_spec import BODY_ERRORS, errors
from argosy.server.api.server_state import ServerState


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model_path: str
    mode: Literal["wait", "abort"] = "wait"
    weight_version: str | None = None  # default: the number of updates so far


def install_weight_routes(app: FastAPI, state: ServerState, loaded_engine: Callable[[], EngineClient]) -> None:
    def enabled(flag: str, setting: bool) -> None:
        if not setting:
            raise APIError(404, f"this endpoint is off: start the server with {flag}", "not_found_error")

    def weight_updates(client: EngineClient = Depends(loaded_engine)) -> EngineClient:
        enabled("--enable-weight-updates", state.config.enable_weight_updates)
        return client

    def sleep_mode(client: EngineClient = Depends(loaded_engine)) -> EngineClient:
        enabled("--enable-sleep-mode", state.config.enable_sleep_mode)
        return client

    @app.post("/v1/update_weights_from_disk", responses=errors(*BODY_ERRORS, 409))
    async def update_weights_from_disk(body: UpdateWeightsRequest, client: EngineClient = Depends(weight_updates)):
        """New weights from a checkpoint of the same shapes, without a restart; requests in flight wait or abort."""
        aborted = await state.weights.update(client, body.model_path, body.mode, body.weight_version)
        state.metrics.set_weight_version(state.weights.version, state.weights.num_updates)
        return {"weight_version": state.weights.version, "num_aborted_requests": aborted}

    @app.post("/sleep", responses=errors(400, 401, 404, 409, 503))
    async def sleep(level: int = Query(1, ge=1, le=2), client: EngineClient = Depends(sleep_mode)):
        """Frees the KV cache (level 1), or the weights too (level 2), until wake-up."""
        freed = await state.weights.sleep(client, level)
        return {"level": level, "freed_bytes": freed}

    @app.post("/wake_up", responses=errors(401, 404, 409, 503))
    async def wake_up(client: EngineClient = Depends(sleep_mode)):
        """Allocates what sleep freed, and serves again."""
        await state.weights.wake_up(client)
        return {"is_sleeping": False}

    @app.get("/is_sleeping", responses=errors(401, 404, 503))
    async def is_sleeping(_: EngineClient = Depends(sleep_mode)):
        """Whether the server sleeps."""
        return {"is_sleeping": state.weights.sleeping is not None}
