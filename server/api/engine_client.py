"""EngineClient: what the HTTP layer knows of the engine (its tokenizer, request building,
limits, live figures, submitting and aborting), over the engine core's process.

Everything here runs on the event loop. Requests and aborts go to the core as commands; each
core message (one per step) is detokenized by the OutputProcessor into deltas, merged into
the requests' streams. If the core process dies, or hangs (the ProgressWatchdog: no step's end,
or no answer to a ping, within --engine-step-timeout), it is killed and every request in flight
ends with EngineDeadError at once."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from argosy.server.api.core_client import CoreClient
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.progress_watchdog import PING, Hang, ProgressWatchdog
from argosy.server.api.request_log import RequestLog
from argosy.server.api.request_stream import RequestStream, StreamLimits
from argosy.server.engine import core_protocol as protocol
from argosy.server.engine.input_processor import InputProcessor, NewRequest
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.request_options import PLAIN, RequestOptions
from argosy.server.exceptions import ArgosyError, EngineDeadError, EngineFailedError, InvalidRequestError
from argosy.server.lora.request import AdapterRef
from argosy.server.outputs import EngineStats, RequestOutput
from argosy.server.sampling_params import RequestOutputKind, SamplingParams
from argosy.server.text.tokenizer import Tokenizer

log = logging.getLogger("argosy.engine")


class EngineOverloadedError(ArgosyError):
    """The waiting queue is full; the client should retry later."""


class EngineUnavailableError(ArgosyError):
    """The engine admits nothing for now (asleep, or its weights changing); retry later."""


class EngineStoppedError(ArgosyError):
    """The server is shutting down: the request was refused or cut short by the drain."""


class EngineClient:
    def __init__(
        self,
        core: CoreClient,
        inputs: InputProcessor,
        ready: protocol.CoreReady,
        max_waiting_requests: int,
        metrics: ServerMetrics,
        limits: StreamLimits,
        step_timeout: float,
    ):
        self.core, self.inputs, self.metrics, self.limits = core, inputs, metrics, limits
        self.max_waiting_requests = max_waiting_requests
        self.outputs = OutputProcessor(inputs.tokenizer)
        self.watchdog = ProgressWatchdog(step_timeout, time.monotonic())
        self._streams: dict[str, RequestStream] = {}
        self._stats = ready.stats
        self.kv_events_bound = ready.kv_events_bound  # where the core's KV events are published, as bound
        self._sent = self._received = self._waiting = self._running = self._steps = 0
        self._stopped = False
        self.dead: str | None = None  # why the core is gone (or hung, and killed), once it is
        self.weight_version = "0"  # of the weights serving: every response names it
        self.unavailable: str | None = None  # why nothing is admitted now (asleep, weights changing)
        self._control: asyncio.Future[protocol.ControlDone] | None = None  # the Control command awaiting its answer
        self.request_log: RequestLog | None = None  # with --enable-log-requests

    @property
    def tokenizer(self) -> Tokenizer:
        return self.inputs.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.inputs.max_model_len

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        add_special_tokens: bool = True,
        options: RequestOptions = PLAIN,
    ) -> NewRequest:
        """Tokenizes and validates; raises InvalidRequestError. Its outputs come as deltas.
        Thread-safe: handlers call it off the event loop, a long prompt takes seconds."""
        delta = replace(params, output_kind=RequestOutputKind.DELTA)
        return self.inputs.make_request(
            request_id, prompt, delta, add_special_tokens=add_special_tokens, options=options
        )

    def load_adapter(self, ref: AdapterRef) -> None:
        """The engine core reads the adapter into host memory (it is served from now on)."""
        self.core.send(protocol.LoadAdapter(ref))

    def retire_adapter(self, digest: str) -> None:
        """No name stands for these weights any more: they go once no request uses them."""
        self.core.send(protocol.RetireAdapter(digest))

    def stats(self) -> EngineStats:
        """The core's figures as of its last message."""
        return self._stats

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def healthy(self) -> bool:
        return self.dead is None

    @property
    def num_waiting(self) -> int:
        """Requests accepted but not yet scheduled (the autoscaling signal), those still on
        their way to the core included."""
        return self._waiting + self._sent - self._received

    @property
    def num_running(self) -> int:
        return self._running

    def submit_all(self, requests: list[NewRequest]) -> list[RequestStream]:
        """Queues the engine requests of one API call (one per prompt), all or none. The
        waiting limit counts engine requests: a call that could never fit under it is a 400;
        one that does not fit now, a 503 (and nothing of it is queued, or counted)."""
        if self._stopped:
            raise EngineStoppedError("the engine is shutting down")
        if self.unavailable is not None:  # checked again here: a call may have been prepared meanwhile
            raise EngineUnavailableError(self.unavailable)
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        if len(requests) > self.max_waiting_requests:
            raise InvalidRequestError(
                f"{len(requests)} prompts in one call exceed the server's queue of {self.max_waiting_requests}",
                param="prompt",
            )
        if self.num_waiting + len(requests) > self.max_waiting_requests:
            raise EngineOverloadedError(f"{self.max_waiting_requests} requests are already waiting")
        if in_flight := [r.request_id for r in requests if r.request_id in self._streams]:
            raise ValueError(f"request id {in_flight[0]!r} is already in flight")
        frames = [protocol.encode_command(r.core) for r in requests]  # before anything is counted
        wake = asyncio.Event()
        return [self._submit(request, frame, wake) for request, frame in zip(requests, frames)]

    def _submit(self, request: NewRequest, frame: bytes, wake: asyncio.Event) -> RequestStream:
        stream = self._streams[request.request_id] = RequestStream(request.request_id, wake, self.limits, self._forget)
        self.outputs.add(request)
        self.core.send_encoded(frame)
        if self.request_log is not None:
            self.request_log.received(request)
        if (constraint := request.params.structured_outputs) is not None:
            self.metrics.count_structured(constraint.kind)
        self._sent += 1
        self.watchdog.sent_work(time.monotonic())
        return stream

    def _forget(self, request_id: str, finished: bool) -> None:
        """Drops a request the caller no longer reads; one that had not finished is aborted."""
        self._streams.pop(request_id, None)
        if self.outputs.abort(request_id) and not finished:
            self._abort([request_id])

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.metrics.observe_abort(request_id)
        if self.dead is None:
            self.core.send(protocol.AbortRequests(request_ids))

    def abort_in_flight(self) -> int:
        """Ends every request in flight as aborted (finish_reason "abort", as their callers
        see it) and has the core drop them; returns how many."""
        ids = list(self._streams)
        now = time.monotonic()
        results, _ = self.outputs.process([out for r in ids for out in self.outputs.abort_outputs(r)], now)
        self._deliver(results, now)
        if ids:
            self._abort(ids)
        return len(ids)

    async def wait_idle(self, poll: float = 0.02) -> None:
        """Until no request is in flight (every response handed to its caller)."""
        while self._streams and self.dead is None:
            await asyncio.sleep(poll)

    async def control(self, command: protocol.Control) -> protocol.ControlDone:
        """Sends a Control command (nothing in flight) and waits for the core's answer; raises
        InvalidRequestError when the command was at fault, EngineFailedError when the engine was."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        frame = protocol.encode_command(command)
        self._control = asyncio.get_running_loop().create_future()
        self.core.send_encoded(frame)
        self.watchdog.sent_control(time.monotonic())
        try:
            done = await self._control
        finally:
            self._control = None
        if done.error is not None:
            raise InvalidRequestError(done.error) if done.invalid else EngineFailedError(done.error)
        return done

    def abort_all(self, reason: str) -> None:
        """Ends every request in flight with EngineStoppedError (used when a drain times out)."""
        if self._streams:
            self._abort(list(self._streams))
        self._end_all(EngineStoppedError(reason))

    def _end_all(self, error: Exception) -> None:
        now = time.monotonic()
        for stream in list(self._streams.values()):
            stream.put(error, now)

    async def run(self) -> None:
        """Delivers the core's outputs until its process ends, it hangs, or delivering them
        fails; whichever, what is in flight then fails, and the server is to exit."""
        watch = asyncio.ensure_future(self._watch())
        try:
            async for message in self.core.messages():
                if isinstance(message, protocol.CoreFailed):
                    self._fail(f"the engine core failed: {message.message}")
                elif isinstance(message, protocol.ControlDone):
                    self.watchdog.heard(time.monotonic(), holds_work=False)
                    if self._control is not None and not self._control.done():
                        self._control.set_result(message)
                else:
                    self._on_message(message)
        except Exception as exc:  # output processing, a stream, a metric: nothing may hang
            log.exception("delivering the engine's outputs failed")
            self._fail(f"the engine loop failed: {type(exc).__name__}: {exc}")
        else:
            if not self._stopped:
                self._fail(f"the engine core process exited with code {self.core.process.returncode}")
        finally:
            watch.cancel()

    async def _watch(self) -> None:
        """Pings an idle core, and fails a hung one; if watching itself fails, the core is
        failed too, rather than left unwatched."""
        watchdog = self.watchdog
        try:
            while True:
                await asyncio.sleep(watchdog.tick)
                if self._stopped or self.dead is not None:  # the core may be gone by now
                    return
                verdict = watchdog.poll(time.monotonic(), unread=self.core.message_waiting())
                if verdict == PING:
                    self.core.send(protocol.Ping())
                elif isinstance(verdict, Hang):
                    self.metrics.count_hang(verdict.waiting_for)
                    self._fail(self._hang_reason(verdict))
        except Exception as exc:
            log.exception("watching the engine core failed")
            self._fail(f"watching the engine core failed: {type(exc).__name__}: {exc}")

    def _hang_reason(self, hang: Hang) -> str:
        if hang.waiting_for == "ping":
            return f"the engine core hung: it answered no ping for {hang.seconds:.1f} s while idle"
        if hang.waiting_for == "control":
            return f"the engine core hung: a weight change has not finished after {hang.seconds:.1f} s"
        ids = ", ".join(list(self._streams)[:8]) + (", ..." if len(self._streams) > 8 else "")
        return (
            f"the engine core hung: step {self._steps + 1} has not finished after {hang.seconds:.1f} s "
            f"({self._running} requests running, {self.num_waiting} waiting; in flight: {ids or 'none'})"
        )

    def _fail(self, reason: str) -> None:
        """The core is gone, or of no more use: it is killed, and what is in flight ends."""
        if self.dead is not None:
            return
        self.dead = reason
        log.error("%s; the server stops", reason)
        self.core.kill()
        self._end_all(EngineDeadError(reason))
        if self._control is not None and not self._control.done():
            self._control.set_exception(EngineDeadError(reason))

    def _on_message(self, message: protocol.EngineCoreOutputs) -> None:
        now = time.monotonic()
        self._received = message.num_requests_received
        holds_work = message.num_waiting_requests + message.num_running_requests > 0 or self._sent > self._received
        self.watchdog.heard(now, holds_work)
        results, stopped = self.outputs.process(message.outputs, now)
        if stopped:
            self.core.send(protocol.FinishSequences(stopped))
        failed = {f.request_id: protocol.failure_error(f) for f in message.failed}
        if broken := self.outputs.take_failed():  # failed here: the core still runs them
            self.core.send(protocol.AbortRequests(list(broken)))
            failed |= {request_id: EngineFailedError(why) for request_id, why in broken.items()}
        for request_id, error in failed.items():
            self.metrics.forget(request_id)
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.put(error, now)
        self._deliver(results, now)
        self._stats = message.stats
        self.metrics.observe_grammar_compiles(message.stats.grammar_compile_seconds)
        self._waiting, self._running = message.num_waiting_requests, message.num_running_requests
        self._steps = message.num_steps
        self.metrics.observe_step(results, now)
        stats = self._stats
        self.metrics.sync_engine_counters(stats)
        self.metrics.observe_engine_step(message.num_steps, message.step_seconds)

    def _deliver(self, results: list[RequestOutput], now: float) -> None:
        for result in results:
            stream = self._streams.get(result.request_id)
            if stream is not None:
                stream.put(result, now)

    async def shutdown(self) -> None:
        self._stopped = True
        await self.core.shutdown()
