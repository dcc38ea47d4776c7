"""`argosy serve`: the HTTP server under uvicorn, with a graceful drain on SIGTERM.

On the first SIGTERM (or SIGINT) /health turns 503 and new requests get 503 while requests
in flight finish and their responses are sent, for at most --shutdown-timeout seconds in all;
whatever is still running then ends with an error event, and the process exits 0. A second
signal exits at once. If the model
fails to load, or the engine core's process dies, the server exits with a non-zero code."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time

import uvicorn

from argosy.flags import add_flags, config_from_args
from argosy.server.api.app import build_app
from argosy.server.api.http_protocol import bounded_protocol
from argosy.server.api.log_format import configure_logging
from argosy.server.api.server_config import ServerConfig, resolve_api_key
from argosy.server.api.server_state import ServerState
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import ArgosyError

log = logging.getLogger("argosy.serve")
ERROR_EVENT_SECONDS = 5.0
# What uvicorn waits for once the drain is over: only responses the drain already gave up on.
CUT_RESPONSES_SECONDS = 1.0
FAILURE_GRACE_SECONDS = 2.0  # for the error responses of a dead core's requests, and probes to see 503


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser.add_argument_group("engine"), EngineConfig)
    add_flags(parser.add_argument_group("server"), ServerConfig)


def server_config(args: argparse.Namespace) -> ServerConfig:
    config = config_from_args(ServerConfig, args, engine=config_from_args(EngineConfig, args))
    config.api_key, config.api_key_file = resolve_api_key(config), None
    return config


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self.state = state
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        watcher = asyncio.ensure_future(self._exit_on_failure())
        try:
            await super().serve(sockets)
        finally:
            watcher.cancel()

    async def _exit_on_failure(self) -> None:
        while self.state.failure is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(FAILURE_GRACE_SECONDS)
        self.should_exit = True

    def handle_exit(self, sig: int, frame) -> None:
        if self.state.draining or self._loop is None:
            self.should_exit = self.force_exit = True
            return
        self.state.draining = True
        log.info("signal %s: draining", signal.Signals(sig).name)
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._drain()))

    async def _drain(self) -> None:
        state = self.state
        if not await _idle(state, state.config.shutdown_timeout):
            log.warning(
                "shutdown timeout: ending %d requests; %d responses unsent",
                state.client.num_in_flight if state.client else 0,
                state.responses_in_flight,
            )
            if state.client is not None:
                state.client.abort_all("the server shut down before the request finished")
            await _idle(state, ERROR_EVENT_SECONDS)  # each stream ends with its error event
        self.should_exit = True


async def _idle(state: ServerState, timeout: float) -> bool:
    """Waits up to `timeout` seconds for every request in flight to end and be sent."""
    deadline = time.monotonic() + timeout
    while not state.idle and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return state.idle


def uvicorn_config(app, config: ServerConfig) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        access_log=False,
        log_config=None,
        timeout_graceful_shutdown=CUT_RESPONSES_SECONDS,
        http=bounded_protocol(config.header_timeout, config.max_connections),
        ssl_keyfile=config.ssl_keyfile,
        ssl_certfile=config.ssl_certfile,
        root_path=config.root_path,
    )


def serve(args: argparse.Namespace) -> int:
    try:
        config = server_config(args)
    except ArgosyError as exc:
        print(f"argosy serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.log_format)
    if config.headless:
        from argosy.server.executor.headless import run_headless

        return run_headless(config.engine)
    app = build_app(config)
    state: ServerState = app.state.argosy
    server = DrainingServer(uvicorn_config(app, config), state)
    server.run()
    return state.exit_code
