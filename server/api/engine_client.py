"""EngineClient: what the HTTP layer knows of the engine (its tokenizer, request building,
limits, stats, submitting and aborting), and the background thread that drives the engine
core, so that asyncio handlers never block the event loop.

The engine thread steps while work exists and sleeps on an event when idle. Requests and
aborts reach it through a command queue and take effect between steps; outputs go back to
each request's asyncio queue through the event loop's thread-safe callback."""

from __future__ import annotations

import asyncio
import logging
import queue
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable

from argosy.server.engine.llm_engine import LLMEngine
from argosy.server.engine.sequence import Request
from argosy.server.exceptions import ArgosyError
from argosy.server.outputs import EngineStats, RequestOutput
from argosy.server.sampling_params import SamplingParams
from argosy.server.text.tokenizer import Tokenizer

log = logging.getLogger("argosy.engine")
SWITCH_INTERVAL_S = 0.0002


class EngineOverloadedError(ArgosyError):
    """The waiting queue is full; the client should retry later."""


class EngineStoppedError(ArgosyError):
    """The server is shutting down: the request was refused or cut short by the drain."""


class EngineFailedError(ArgosyError):
    """An engine step failed (a bug): the requests of that step end with this error."""


class EngineClient:
    def __init__(
        self,
        core: LLMEngine,
        max_waiting_requests: int,
        on_step: Callable[[list[RequestOutput], float], None] | None = None,
        on_abort: Callable[[str], None] | None = None,
    ):
        self.core = core  # driven by this client's thread only
        self.max_waiting_requests = max_waiting_requests
        self.on_step = on_step
        self.on_abort = on_abort
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._pending = 0  # adds queued but not yet seen by the engine thread
        self._waiting = 0  # requests in the scheduler's waiting queue, as of the last look
        self._running = 0
        self._stopped = False
        # Between kernels the engine thread runs Python and holds the GIL; a short switch
        # interval hands it to the event loop within a fraction of a millisecond, so requests
        # are accepted (or refused) promptly while the engine is busy.
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self._thread = threading.Thread(target=self._run, name="argosy-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.core.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.core.limits.max_model_len

    def make_request(self, request_id: str, prompt: str | list[int], params: SamplingParams) -> Request:
        """Tokenizes and validates, in the caller's thread; raises InvalidRequestError."""
        return self.core.inputs.make_request(request_id, prompt, params)

    def stats(self) -> EngineStats:
        return self.core.stats()

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def healthy(self) -> bool:
        return self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet scheduled: the autoscaling signal."""
        return self._pending + self._waiting

    @property
    def num_running(self) -> int:
        return self._running

    def submit(self, request: Request) -> RequestStream:
        """Queues a validated request, or raises at once when the waiting queue is full or
        the engine is stopping. Iterate the returned stream for its outputs."""
        stream: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if self._stopped:
                raise EngineStoppedError("the engine is shutting down")
            if not self._thread.is_alive():
                raise EngineFailedError("the engine loop is not running")
            if request.request_id in self._streams:
                raise ValueError(f"request id {request.request_id!r} is already in flight")
            if self.num_waiting >= self.max_waiting_requests:
                raise EngineOverloadedError(f"{self.max_waiting_requests} requests are already waiting")
            self._pending += 1
            self._streams[request.request_id] = (asyncio.get_running_loop(), stream)
        self._send(("add", request))
        return RequestStream(self, request.request_id, stream)

    def _forget(self, request_id: str, finished: bool) -> None:
        self._streams.pop(request_id, None)
        if not finished:
            self._send(("abort", request_id))

    def abort_all(self, reason: str) -> None:
        """Ends every request in flight with EngineStoppedError (used when a drain times out)."""
        for request_id in list(self._streams):
            self._deliver(request_id, EngineStoppedError(reason))
            self._send(("abort", request_id))

    def shutdown(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=10)

    def _send(self, command: tuple) -> None:
        self._commands.put(command)
        self._wake.set()

    def _deliver(self, request_id: str, item: RequestOutput | Exception) -> None:
        target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)

    def _run(self) -> None:
        while not self._stopped:
            self._apply_commands()
            if not self.core.has_unfinished_requests():
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                outputs = self.core.step()
            except Exception as exc:  # a bug must fail its requests, not hang them or the loop
                log.exception("engine step failed")
                for request_id in self.core.request_ids():
                    self._abort(request_id)
                    self._deliver(request_id, EngineFailedError(f"engine step failed: {exc!r}"))
                continue
            for output in outputs:
                self._deliver(output.request_id, output)
            with self._lock:
                self._count_waiting()
            if self.on_step is not None:
                self.on_step(outputs, time.monotonic())

    def _apply_commands(self) -> None:
        while True:
            try:
                kind, payload = self._commands.get_nowait()
            except queue.Empty:
                break
            if kind == "add":
                self._add(payload)
            else:
                self._abort(payload)

    def _add(self, request: Request) -> None:
        with self._lock:  # the waiting count never dips between the two queues
            self._pending -= 1
            if request.request_id not in self._streams:  # abandoned while queued
                if self.on_abort is not None:
                    self.on_abort(request.request_id)
                return
            try:
                self.core.enqueue(request)
            except Exception as exc:  # this request alone fails
                log.exception("could not queue request %s", request.request_id)
                self._deliver(request.request_id, EngineFailedError(f"could not queue the request: {exc!r}"))
            self._count_waiting()

    def _abort(self, request_id: str) -> None:
        if self.core.abort(request_id) and self.on_abort is not None:
            self.on_abort(request_id)
        with self._lock:
            self._count_waiting()

    def _count_waiting(self) -> None:
        """Caller holds the lock."""
        self._waiting, self._running = self.core.num_requests()


class RequestStream:
    """The outputs of one submitted request. Leaving the iteration early (a client disconnect
    cancels it) or closing the stream aborts the request."""

    def __init__(self, client: EngineClient, request_id: str, queue: asyncio.Queue):
        self.client, self.request_id, self._queue = client, request_id, queue
        self._done = False

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        try:
            while not self._done:
                item = await self._queue.get()
                if isinstance(item, Exception):
                    self._done = True
                    raise item
                self._done = item.finished
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Aborts the request unless it already finished."""
        self.client._forget(self.request_id, self._done)
        self._done = True
