"""`argosy serve`: the HTTP server under uvicorn, with a graceful drain on SIGTERM.

On the first SIGTERM (or SIGINT) /health turns 503 and new requests get 503 while requests
in flight finish, for at most --shutdown-timeout seconds; whatever is still running then ends
with an error event, and the process exits 0. A second signal exits at once."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import time

import uvicorn

from argosy.server.api.app import build_app
from argosy.server.api.log_format import configure_logging
from argosy.server.api.server_state import ServerConfig, ServerState
from argosy.server.engine_args import add_engine_args, config_from_args

log = logging.getLogger("argosy.serve")
API_KEY_ENV = "ARGOSY_API_KEY"
ERROR_EVENT_SECONDS = 5.0


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    add_engine_args(parser)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"bearer key required on /v1/* (default: ${API_KEY_ENV})")
    g.add_argument("--max-waiting-requests", type=int, default=1024,
                   help="queued requests beyond which new ones get 503 + Retry-After")
    g.add_argument("--shutdown-timeout", type=float, default=60.0,
                   help="seconds requests in flight may take to finish after SIGTERM")
    g.add_argument("--max-request-body-bytes", type=int, default=8 << 20)
    g.add_argument("--log-format", choices=["json", "text"], default="json")


def server_config(args: argparse.Namespace) -> ServerConfig:
    return ServerConfig(engine=config_from_args(args), host=args.host, port=args.port, api_key=args.api_key,
                        max_waiting_requests=args.max_waiting_requests, shutdown_timeout=args.shutdown_timeout,
                        max_request_body_bytes=args.max_request_body_bytes, log_format=args.log_format)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self.state.draining = True
        log.info("signal %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        engine = self.state.engine
        if engine is not None and not await _finished(engine, self.state.config.shutdown_timeout):
            log.warning("shutdown timeout: ending %d requests", engine.num_in_flight)
            engine.abort_all("the server shut down before the request finished")
            await _finished(engine, ERROR_EVENT_SECONDS)  # each stream ends with its error event
        self.should_exit = True


async def _finished(engine, timeout: float) -> bool:
    """Waits up to `timeout` seconds for every request in flight to end."""
    deadline = time.monotonic() + timeout
    while engine.num_in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not engine.num_in_flight


def serve(args: argparse.Namespace) -> int:
    config = server_config(args)
    configure_logging(config.log_format)
    app = build_app(config)
    state: ServerState = app.state.argosy
    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, access_log=False,
                                           log_config=None, timeout_graceful_shutdown=5), state)

    async def watch_loading() -> None:
        while state.engine is None and state.load_error is None:
            await asyncio.sleep(0.1)
        if state.load_error is not None:
            server.should_exit = True

    async def main() -> None:
        watcher = asyncio.ensure_future(watch_loading())
        await server.serve()
        watcher.cancel()

    asyncio.run(main())
    return 1 if state.load_error is not None else 0
