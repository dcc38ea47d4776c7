"""CoreClient: the engine core's child process as the API process's event loop sees it. It
starts the process, waits for it to load the model, sends it commands and receives its
messages, over two ZeroMQ sockets on IPC paths of a private folder. The core runs in a
process group of its own, so that killing it kills whatever it started too (every rank)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import zmq
import zmq.asyncio

from argosy.server.engine import core_protocol as protocol
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import ArgosyError

log = logging.getLogger("argosy.engine")
EXIT_POLL_S = 0.1
SHUTDOWN_WAIT_S = 10.0


class CoreStartError(ArgosyError):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class CoreClient:
    def __init__(self, config: EngineConfig, log_format: str):
        self._folder = Path(tempfile.mkdtemp(prefix="argosy-core-"))
        commands, outputs = f"ipc://{self._folder / 'commands'}", f"ipc://{self._folder / 'outputs'}"
        # Commands go out from the event loop and never block (no high-water mark): a plain
        # socket suffices. Outputs are awaited.
        self._sync_context, self._async_context = zmq.Context(), zmq.asyncio.Context()
        self._commands = self._sync_context.socket(zmq.PUSH)
        self._outputs = self._async_context.socket(zmq.PULL)
        for sock, address in ((self._commands, commands), (self._outputs, outputs)):
            sock.set_hwm(0)
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind(address)
        # -P: the working directory never joins sys.path, where a source folder of a checkout could
        # shadow an installed package.
        command = [sys.executable, "-P", "-m", "argosy.server.engine.core_process"]
        command += ["--commands", commands, "--outputs", outputs, "--log-format", log_format]
        command += ["--config", msgspec.json.encode(config).decode()]
        self.process = subprocess.Popen(command, start_new_session=True)
        self._receiving: asyncio.Future | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    async def wait_ready(self) -> protocol.CoreReady:
        """Waits for the model to load; raises CoreStartError if the core fails or dies first."""
        exited = asyncio.ensure_future(self.wait_exit())
        try:
            message = await self._next_message(exited)
        finally:
            exited.cancel()
            # Connected sockets outlive their files: removed now, no exit can leave them behind.
            shutil.rmtree(self._folder, ignore_errors=True)
        if message is None:
            raise CoreStartError(f"the engine core exited with code {self.process.returncode}", 1)
        if isinstance(message, protocol.CoreFailed):
            raise CoreStartError(message.message, message.exit_code)
        if not isinstance(message, protocol.CoreReady):
            raise CoreStartError(f"the engine core sent {type(message).__name__} before CoreReady", 1)
        return message

    def send(self, command: protocol.CoreCommand) -> None:
        self.send_encoded(protocol.encode(command))

    def send_encoded(self, frame: bytes) -> None:
        """Sends a command (protocol.encode's) without ever blocking the event loop. With no core at
        the socket's other end (it has just exited) a PUSH socket would block for good: the command
        is dropped instead, and the core's exit, seen within EXIT_POLL_S, fails whatever it concerned."""
        try:
            self._commands.send(frame, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            log.warning("the engine core is not there to take a command")

    async def messages(self) -> AsyncIterator[protocol.EngineCoreOutputs | protocol.CoreFailed]:
        """The core's messages while it serves, until its process ends."""
        exited = asyncio.ensure_future(self.wait_exit())
        try:
            while (message := await self._next_message(exited)) is not None:
                if not isinstance(message, protocol.CoreReady):
                    yield message
        finally:
            exited.cancel()

    def message_waiting(self) -> bool:
        """Whether a message has arrived that the event loop has not handled yet (a loop held up
        by other work must not take the core's silence for a hang)."""
        arrived = self._receiving is not None and self._receiving.done()
        return arrived or bool(self._outputs.get(zmq.EVENTS) & zmq.POLLIN)

    async def _next_message(self, exited: asyncio.Future) -> protocol.CoreMessage | None:
        """The core's next message, or None once `exited` (its process has ended) is done first."""
        receive = self._receiving = asyncio.ensure_future(self._outputs.recv())
        await asyncio.wait({receive, exited}, return_when=asyncio.FIRST_COMPLETED)
        self._receiving = None
        if not receive.done():
            receive.cancel()
            return None
        return protocol.decode_message(receive.result())

    async def wait_exit(self) -> int:
        while self.process.poll() is None:
            await asyncio.sleep(EXIT_POLL_S)
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL to the core's process group: the core and every process it started, stopped
        or not (a stopped process dies of SIGKILL too)."""
        with contextlib.suppress(ProcessLookupError):  # the whole group is gone already
            os.killpg(self.process.pid, signal.SIGKILL)

    async def shutdown(self, kill: bool = False) -> None:
        """Asks the core to stop, kills it if it does not (or at once, with `kill`: it may be
        busy loading and never read the request), and removes the sockets."""
        if kill:
            self.kill()
        if self.alive:
            self.send(protocol.Shutdown())
            try:
                await asyncio.wait_for(self.wait_exit(), SHUTDOWN_WAIT_S)
            except TimeoutError:
                log.warning("the engine core did not stop within %.0f s of being asked: killed", SHUTDOWN_WAIT_S)
                self.kill()
        self.process.wait()
        self._commands.close()
        self._outputs.close()
        self._sync_context.term()
        self._async_context.term()
        shutil.rmtree(self._folder, ignore_errors=True)
