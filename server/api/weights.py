"""WeightsControl: which weights serve (their version, named by every response), whether the
server sleeps, and the one weight change (update, sleep, wake-up) that may run at a time. A
change stops admitting (new requests get 503 and Retry-After), drains what is in flight (waits
for it, or aborts it), then has the engine core do the change; admitting resumes after, except
while asleep."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from argosy.server.api.engine_client import EngineClient
from argosy.server.engine import core_protocol as protocol
from argosy.server.exceptions import ConflictError, InvalidRequestError


class WeightsControl:
    def __init__(self) -> None:
        self.version = "0"
        self.num_updates = 0
        self.sleeping: int | None = None  # the level, while asleep
        self.changing: str | None = None  # the change under way, while one is
        self._lock = asyncio.Lock()

    def _admission(self, client: EngineClient) -> None:
        """Tells the engine client why new requests are refused now (None: they are admitted)."""
        if self.changing is not None:
            client.unavailable = f"the server is busy: {self.changing}"
        elif self.sleeping is not None:
            client.unavailable = f"the server is asleep (level {self.sleeping}); POST /wake_up"
        else:
            client.unavailable = None

    async def update(self, client: EngineClient, path: str, mode: Literal["wait", "abort"], version: str | None) -> int:
        """Swaps in the checkpoint at `path`; returns the requests aborted to do it."""
        async with self._change(client, "updating the weights", mode) as aborted:
            try:
                await client.control(protocol.UpdateWeights(path))
            except InvalidRequestError as exc:  # the checkpoint at fault: the field that named it
                exc.param = exc.param or "model_path"
                raise
            if self.sleeping == 2:  # the weights are back; the KV cache waits for the wake-up
                self.sleeping = 1
            self.num_updates += 1
            self.version = client.weight_version = version or str(self.num_updates)
        return aborted

    async def sleep(self, client: EngineClient, level: int) -> int:
        """Returns the bytes freed."""
        if self.sleeping is not None and level <= self.sleeping:
            raise ConflictError(f"already asleep at level {self.sleeping}", param="level")
        async with self._change(client, f"going to sleep (level {level})", "wait"):
            done = await client.control(protocol.Sleep(level))
            self.sleeping = level
        return done.freed_bytes

    async def wake_up(self, client: EngineClient) -> None:
        if self.sleeping is None:
            return
        async with self._change(client, "waking up", "wait"):
            await client.control(protocol.WakeUp())
            self.sleeping = None

    @asynccontextmanager
    async def _change(self, client: EngineClient, what: str, mode: str) -> AsyncIterator[int]:
        """Admission stopped and the engine drained for the block (which gets the number of
        requests aborted); a second change meanwhile is a 409."""
        if self._lock.locked():
            raise ConflictError(f"another weight change is under way ({self.changing})")
        if mode not in ("wait", "abort"):
            raise InvalidRequestError(f"mode must be wait or abort, got {mode!r}", param="mode")
        async with self._lock:
            self.changing = what
            self._admission(client)  # before the drain: nothing joins what it waits for
            try:
                aborted = client.abort_in_flight() if mode == "abort" else 0
                await client.wait_idle()
                yield aborted
            finally:
                self.changing = None
                self._admission(client)
