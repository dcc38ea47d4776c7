"""The OpenAPI document, as the server answers: each route's errors (the ErrorBody model every
error handler writes, under the statuses that route can answer), the probes' empty bodies,
/metrics as text, and streams as server-sent events. FastAPI's own 422 is gone: a body that
fails validation gets 400 here, as from OpenAI."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from argosy.server.api.error_responses import ErrorBody

ERRORS = {
    400: "invalid JSON, or a field out of range (`param` names it)",
    401: "a missing or wrong API key (when the server has one)",
    404: "a model or adapter this server does not serve",
    409: "an adapter name already loaded (without load_inplace)",
    408: "the request body arrived too slowly",
    413: "the request body is too large",
    415: "the request body is not declared application/json",
    500: "the engine failed",
    503: "the queue is full, the model is loading, or the server is draining (with Retry-After)",
}
GENERATION_ERRORS = (400, 401, 404, 408, 413, 415, 500, 503)
BODY_ERRORS = (400, 401, 404, 408, 413, 415, 503)  # of a POST with a JSON body under /v1


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The `responses` of a route for these error statuses, every body an ErrorBody."""
    return {status: {"model": ErrorBody, "description": ERRORS[status]} for status in statuses}


def generation_responses() -> dict[int | str, dict[str, Any]]:
    ok = body("text/event-stream", {"type": "string"}, "the completion, or with `stream` its server-sent events")
    return {200: ok, **errors(*GENERATION_ERRORS)}


def no_body(description: str) -> dict[str, Any]:
    return {"description": description, "content": {}}


def body(media_type: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {media_type: {"schema": schema}}}


STATUS = {"type": "object", "properties": {"status": {"type": "string"}}}
HEALTH_RESPONSES = {
    200: no_body("the model is loaded and the server takes requests"),
    503: body("application/json", STATUS, "loading, draining, or failed"),
}
LIVE_RESPONSES = {200: no_body("the process and its engine core run"), 503: no_body("the engine core is gone")}
METRICS_RESPONSES = {200: body("text/plain", {"type": "string"}, "Prometheus text format")}


def install_openapi(app: FastAPI) -> None:
    def document() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for operations in doc["paths"].values():
                for operation in operations.values():
                    operation["responses"].pop("422", None)
            schemas = doc.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = document
