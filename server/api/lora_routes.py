"""The adapter endpoints, as vLLM's: `POST /v1/load_lora_adapter` and
`POST /v1/unload_lora_adapter`, behind the API key like every /v1 route, served only with
`--allow-runtime-lora-updating` (or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true, as KubeAI and AIBrix
set it). 400: a bad body or an adapter that cannot be served (naming the file and field); 404:
an unknown name; 409: a name already loaded, unless `load_inplace`."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Depends, FastAPI
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from argosy.server.api.adapters import ServedAdapters
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.error_responses import APIError
from argosy.server.api.openapi_spec import BODY_ERRORS, body, errors
from argosy.server.api.server_state import ServerState

DONE = {200: body("text/plain", {"type": "string"}, "what was done, in a sentence (as vLLM answers)")}


class LoadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    lora_name: str
    lora_int_id: int | None = None  # vLLM's; names are what identify adapters here


def install_lora_routes(app: FastAPI, state: ServerState, serving_engine: Callable[[], EngineClient]) -> None:
    def runtime_updates(_: EngineClient = Depends(serving_engine)) -> ServedAdapters:
        if not state.config.allow_runtime_lora_updating:
            raise APIError(
                404,
                "loading adapters while serving is off: start with --allow-runtime-lora-updating "
                "(or VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)",
                "not_found_error",
            )
        if state.adapters is None:
            raise APIError(400, "LoRA is off: start with --enable-lora", "invalid_request_error")
        return state.adapters

    @app.post("/v1/load_lora_adapter", response_class=Response, responses={**DONE, **errors(*BODY_ERRORS, 409)})
    async def load_lora_adapter(
        body: LoadLoRAAdapterRequest, adapters: ServedAdapters = Depends(runtime_updates)
    ) -> PlainTextResponse:
        """Loads a LoRA adapter from a folder under a name (load_inplace: replaces one of that name)."""
        await adapters.load(body.lora_name, body.lora_path, body.load_inplace)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter", response_class=Response, responses={**DONE, **errors(*BODY_ERRORS)})
    async def unload_lora_adapter(
        body: UnloadLoRAAdapterRequest, adapters: ServedAdapters = Depends(runtime_updates)
    ) -> PlainTextResponse:
        """Unloads an adapter by name."""
        adapters.unload(body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
