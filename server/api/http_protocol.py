"""BoundedHTTPProtocol: uvicorn's HTTP/1.1 protocol with a bound on the number of open
connections and on the time a client may take to send a request's headers. uvicorn closes
idle keep-alive connections, but one that has sent part of a request line or headers (or
nothing at all) it holds for ever, so that a few hundred slow clients can use up the file
descriptors. (The body's bound, which needs the request, is BodyLimits' in the middleware.)"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.h11_impl import H11Protocol

from argosy.server.api.error_responses import RETRY_AFTER_SECONDS, error_body


def raw_response(status: str, body: dict | None = None, headers: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection, for before a request is read."""
    payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else b""
    kind = "content-type: application/json\r\n" if body is not None else ""
    head = f"HTTP/1.1 {status}\r\n{kind}{headers}content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    return head.encode() + payload


REQUEST_TIMEOUT = raw_response("408 Request Timeout")
TOO_MANY_CONNECTIONS = raw_response(
    "503 Service Unavailable",
    error_body("too many open connections; retry later", "service_unavailable_error", code="too_many_connections"),
    f"retry-after: {RETRY_AFTER_SECONDS}\r\n",
)


class BoundedHTTPProtocol(H11Protocol):
    header_timeout: float = 10.0  # both set per server by bounded_protocol
    max_connections: int = 2048

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._header_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:  # this one included
            transport.write(TOO_MANY_CONNECTIONS)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._awaiting_headers:
            self._arm()  # the first bytes of a request on a kept-alive connection start the clock
        else:
            self._disarm()

    @property
    def _awaiting_headers(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        # Armed once per request: bytes trickling in do not push the deadline back.
        if self._header_deadline is None and not self.transport.is_closing():
            self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_timed_out)

    def _disarm(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_timed_out(self) -> None:
        self._header_deadline = None
        if self._awaiting_headers and not self.transport.is_closing():
            self._unset_keepalive_if_required()
            self.transport.write(REQUEST_TIMEOUT)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Idle now: uvicorn's keep-alive timeout holds until the next request's first bytes.
        self._disarm()


def bounded_protocol(header_timeout: float, max_connections: int) -> type[BoundedHTTPProtocol]:
    """The protocol class for one server's settings (uvicorn takes a class, not an instance)."""
    settings = {"header_timeout": header_timeout, "max_connections": max_connections}
    return type("BoundedHTTPProtocol", (BoundedHTTPProtocol,), settings)
