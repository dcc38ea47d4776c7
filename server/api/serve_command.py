"""`argosy serve`: the HTTP server under uvicorn, with a graceful drain on SIGTERM.

On the first SIGTERM (or SIGINT) /health turns 503 and new requests get 503 while requests
in flight finish, for at most --shutdown-timeout seconds; whatever is still running then ends
with an error event, and the process exits 0. A second signal exits at once."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time

import uvicorn

from argosy.flags import add_flags, config_from_args
from argosy.server.api.app import build_app
from argosy.server.api.engine_client import EngineClient
from argosy.server.api.log_format import configure_logging
from argosy.server.api.server_config import ServerConfig
from argosy.server.api.server_state import ServerState
from argosy.server.engine_config import EngineConfig

log = logging.getLogger("argosy.serve")
ERROR_EVENT_SECONDS = 5.0


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser.add_argument_group("engine"), EngineConfig)
    add_flags(parser.add_argument_group("server"), ServerConfig)


def server_config(args: argparse.Namespace) -> ServerConfig:
    return config_from_args(ServerConfig, args, engine=config_from_args(EngineConfig, args))


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
        client = self.state.client
        if client is not None and not await _finished(client, self.state.config.shutdown_timeout):
            log.warning("shutdown timeout: ending %d requests", client.num_in_flight)
            client.abort_all("the server shut down before the request finished")
            await _finished(client, ERROR_EVENT_SECONDS)  # each stream ends with its error event
        self.should_exit = True


async def _finished(client: EngineClient, timeout: float) -> bool:
    """Waits up to `timeout` seconds for every request in flight to end."""
    deadline = time.monotonic() + timeout
    while client.num_in_flight and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return not client.num_in_flight


def serve(args: argparse.Namespace) -> int:
    config = server_config(args)
    configure_logging(config.log_format)
    app = build_app(config)
    state: ServerState = app.state.argosy
    server = DrainingServer(
        uvicorn.Config(
            app, host=config.host, port=config.port, access_log=False, log_config=None, timeout_graceful_shutdown=5
        ),
        state,
    )

    async def watch_loading() -> None:
        while state.client is None and state.load_error is None:
            await asyncio.sleep(0.1)
        if state.load_error is not None:
            server.should_exit = True

    async def main() -> None:
        watcher = asyncio.ensure_future(watch_loading())
        await server.serve()
        watcher.cancel()

    asyncio.run(main())
    return state.exit_code
