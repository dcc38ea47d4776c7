"""ASGI middleware in front of every route: the count of responses in flight, the API key on
/v1/*, JSON bodies on /v1/*, and the body's size and time limits."""

from __future__ import annotations

import asyncio
import hmac

from argosy.server.api.error_responses import APIError, error_response
from argosy.server.interface import SLEEP_PATHS


def header(scope, name: bytes) -> bytes | None:
    """A request header's value (names come lower-case from the server)."""
    return dict(scope.get("headers") or []).get(name)


def bearer_token(authorization: bytes | None) -> bytes | None:
    """The credentials of `Bearer <token>`; the scheme is case-insensitive (RFC 9110)."""
    scheme, _, token = (authorization or b"").strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" and token.strip() else None


class ResponsesInFlight:
    """Counts the HTTP requests whose responses are not yet sent, so that a drain waits for
    slow readers too. The server waits for the socket before each write, not after, so a body
    goes out in pieces of at most WRITE_BYTES: once the app returns, no more than that is left
    in the server's buffer, which the closing connection flushes."""

    WRITE_BYTES = 1 << 16

    def __init__(self, app, state):
        self.app, self.state = app, state

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_in_pieces(message):
            body = message.get("body", b"")
            if message["type"] != "http.response.body" or len(body) <= self.WRITE_BYTES:
                return await send(message)
            view = memoryview(body)
            for start in range(0, len(body), self.WRITE_BYTES):
                piece = bytes(view[start : start + self.WRITE_BYTES])
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            if not message.get("more_body", False):
                await send({"type": "http.response.body", "body": b"", "more_body": False})

        self.state.responses_in_flight += 1
        try:
            await self.app(scope, receive, send_in_pieces)
        finally:
            self.state.responses_in_flight -= 1


class APIKeyCheck:
    """Answers 401 to a /v1/* or sleep-mode request without `Authorization: Bearer <key>`;
    /health, /live and /metrics stay open for probes and scrapers. The key is compared in
    constant time."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, key.encode()

    def _allowed(self, scope) -> bool:
        token = bearer_token(header(scope, b"authorization"))
        return token is not None and hmac.compare_digest(token, self.expected)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _guarded(route_path(scope)) and not self._allowed(scope):
            response = error_response(
                APIError(401, "invalid or missing API key", "authentication_error", code="invalid_api_key")
            )
            return await response(scope, receive, send)
        return await self.app(scope, receive, send)


def _guarded(path: str) -> bool:
    """The API, the sleep-mode routes that change what serves, and the tokenizer's routes."""
    return path.startswith("/v1") or path in SLEEP_PATHS or path in ("/tokenize", "/detokenize")


def route_path(scope) -> str:
    """The path the routes see: without the --root-path prefix the request may carry."""
    path, root = scope["path"], scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


class JSONBodies:
    """Answers 415 to a POST on /v1/* whose Content-Type is not JSON (or is missing), rather
    than guessing what the body is."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and route_path(scope).startswith("/v1"):
            content_type = header(scope, b"content-type") or b""
            if content_type.split(b";")[0].strip().lower() != b"application/json":
                response = error_response(
                    APIError(
                        415,
                        "the request body must be JSON (Content-Type: application/json)",
                        "invalid_request_error",
                        code="unsupported_media_type",
                    )
                )
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)


class BodyLimits:
    """Bounds a request body: more than `max_bytes` (announced or streamed) gets 413, a body not
    wholly received `timeout` seconds after its headers gets 408. Either is answered here, and
    the app sees a disconnect. Reads after the body (waiting for a disconnect) are not bounded."""

    def __init__(self, app, max_bytes: int, timeout: float):
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send, self._too_large())
        deadline = asyncio.get_running_loop().time() + self.timeout
        received, body_done, rejected = 0, False, False

        async def limited_receive():
            nonlocal received, body_done, rejected
            if body_done or rejected:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except TimeoutError:
                rejected = True
                await self._reject(send, self._too_slow())
                return {"type": "http.disconnect"}
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                rejected = True
                await self._reject(send, self._too_large())
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def guarded_send(message):
            if not rejected:
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    def _too_large(self) -> APIError:
        message = f"request body exceeds {self.max_bytes} bytes"
        return APIError(413, message, "invalid_request_error", code="request_too_large")

    def _too_slow(self) -> APIError:
        message = f"the request body did not arrive within {self.timeout:g} s"
        return APIError(408, message, "invalid_request_error", code="request_timeout")

    async def _reject(self, send, error: APIError) -> None:
        # The rest of the body is never read: the connection cannot carry another request.
        error.headers = {**(error.headers or {}), "connection": "close"}
        await error_response(error)({"type": "http"}, None, send)
