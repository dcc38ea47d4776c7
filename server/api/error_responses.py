"""Every error leaves the server in OpenAI's shape:
{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}."""

from __future__ import annotations

import json
import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException

from argosy.server.api.engine_client import EngineOverloadedError, EngineStoppedError, EngineUnavailableError
from argosy.server.api.request_stream import StreamStalledError
from argosy.server.exceptions import EngineFailedError, InvalidRequestError

log = logging.getLogger("argosy.api")
RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error response's body; the OpenAPI document describes them with this model."""

    error: ErrorDetail


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return ErrorBody(error=ErrorDetail(message=message, type=type, param=param, code=code)).model_dump()


def retry_later(message: str, code: str) -> APIError:
    """A 503 the client should retry after a moment."""
    return APIError(
        503, message, "service_unavailable_error", code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)}
    )


def to_api_error(exc: Exception) -> APIError:
    """The HTTP meaning of an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(exc.status, str(exc), "invalid_request_error", exc.param, exc.code)
    if isinstance(exc, EngineOverloadedError):
        return retry_later(f"server overloaded: {exc}; retry later", "overloaded")
    if isinstance(exc, StreamStalledError):
        return APIError(408, str(exc), "invalid_request_error", code="stream_stalled")
    if isinstance(exc, EngineFailedError):
        log.error("request failed: %s", exc)
        return APIError(500, str(exc), "internal_error")
    if isinstance(exc, EngineUnavailableError):
        return retry_later(str(exc), "weights_unavailable")
    if isinstance(exc, EngineStoppedError):
        return retry_later(str(exc), "shutting_down")
    log.exception("unexpected error", exc_info=exc)
    return APIError(500, "internal server error", "internal_error")


class ErrorJSONResponse(JSONResponse):
    """Errors may echo what the client sent, lone surrogates included: written as \\u escapes,
    every string is valid JSON (FastAPI's UTF-8 rendering would fail, and answer 500)."""

    def render(self, content) -> bytes:
        return json.dumps(content, separators=(",", ":")).encode("ascii")


def error_response(exc: Exception) -> JSONResponse:
    err = to_api_error(exc)
    return ErrorJSONResponse(
        error_body(err.message, err.type, err.param, err.code), status_code=err.status, headers=err.headers
    )


# pydantic names each member of a union it tried (`prompt.str`, `prompt.list[int].0`): not fields.
_UNION_MEMBER = re.compile(r"(str|int|float|bool|list|dict)(\[.*\])?|function-.*")


def field_path(loc: tuple) -> str:
    """A validation error's location as the field's name: `messages.0.role`, `prompt`."""
    parts = [str(p) for p in loc if p != "body" and not (isinstance(p, str) and _UNION_MEMBER.fullmatch(p))]
    return ".".join(parts)


def _matches(route: object, path: str) -> bool:
    regex, methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
    return regex is not None and methods is not None and regex.match(path) is not None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return error_response(
                APIError(400, f"invalid JSON body: {first.get('ctx', {}).get('error', '')}", "invalid_request_error")
            )
        param = field_path(first.get("loc", ())) or None
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg", "invalid request body"))
        return error_response(APIError(400, message, "invalid_request_error", param))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = {401: "authentication_error", 404: "not_found_error"}.get(exc.status_code, "invalid_request_error")
        headers = exc.headers
        if exc.status_code == 405:  # Allow names the methods of every route of the path, not only the first's
            methods = {m for r in request.app.routes if _matches(r, request.url.path) for m in r.methods}
            headers = {**(headers or {}), "Allow": ", ".join(sorted(methods))}
        return error_response(APIError(exc.status_code, str(exc.detail), kind, headers=headers))

    async def _known(request: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    for cls in (
        APIError,
        InvalidRequestError,
        EngineOverloadedError,
        EngineUnavailableError,
        EngineStoppedError,
        EngineFailedError,
        Exception,
    ):
        app.add_exception_handler(cls, _known)


def sse_error(exc: Exception) -> str:
    err = to_api_error(exc)
    return f"data: {json.dumps(error_body(err.message, err.type, err.param, err.code))}\n\n"
