"""What the two generation endpoints share: their flow (`serve_call`: request ids, preparing the
prompts off the event loop, one engine request per prompt with their output streams merged, a
stream or one body, cancellation on client disconnect), and the access-log line."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar

from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from argosy.server.api.engine_client import EngineClient
from argosy.server.api.protocol import SamplingFields
from argosy.server.api.request_stream import RequestStream, merge_delta
from argosy.server.engine.input_processor import NewRequest
from argosy.server.engine.request_options import RequestOptions
from argosy.server.exceptions import ArgosyError, EngineFailedError
from argosy.server.kv_transfer.params import KVTransferParams
from argosy.server.lora.request import AdapterRef
from argosy.server.outputs import RequestOutput
from argosy.server.sampling_params import SamplingParams

WEIGHT_VERSION_HEADER = "X-Weight-Version"  # which weights produced the response
log = logging.getLogger("argosy.api")
access_log = logging.getLogger("argosy.access")
DISCONNECTED = object()  # what cancel_on_disconnect returns when the client went away
Prepared = TypeVar("Prepared")


def new_request_id(http: HTTPRequest, prefix: str) -> str:
    """The id reported to the client: its X-Request-Id if it sent one. Engine requests get
    ids of their own (`engine_request_id`), so a repeated header can never collide."""
    return http.headers.get("x-request-id") or f"{prefix}-{uuid.uuid4().hex}"


def peer(http: HTTPRequest) -> str | None:
    """The client's address, as the connection shows it."""
    return http.client.host if http.client is not None else None


def engine_request_id(request_id: str, index: int = 0) -> str:
    return f"{request_id}-{index}-{uuid.uuid4().hex[:12]}"


class Reply(Protocol):
    """How one endpoint answers a call: as server-sent events, or as one body once every
    request has finished."""

    def stream(self) -> AsyncIterator[str]: ...

    def body(self, finals: list[RequestOutput]) -> dict: ...


async def serve_call(
    body: SamplingFields,
    http: HTTPRequest,
    resolve_model: Callable[[str], AdapterRef | None],
    client: EngineClient,
    id_prefix: str,
    build: Callable[[str, SamplingParams, RequestOptions], tuple[list[NewRequest], Prepared]],
    reply: Callable[[Generation, SamplingParams, Prepared], Reply],
    render: Callable[[list[dict]], Any] | None = None,
    pin_s: float = 0.0,
) -> Response:
    """One generation call: its sampling parameters are read and `build` makes its engine requests
    (and whatever else the reply needs) from its id, those parameters and its options (the adapter
    `model` names, its priority and user, and the peer), off the event loop; they are submitted;
    then `reply` answers, streamed or whole (499 when the client leaves before the end). However the
    call ends, its requests end with it; `pin_s`: how long their blocks stay ahead in the eviction
    order once they end (a conversation that goes on)."""
    transfer = KVTransferParams.parse(body.kv_transfer_params)
    options = RequestOptions(resolve_model(body.model), body.priority, body.user, peer(http), transfer, pin_s)
    request_id = new_request_id(http, id_prefix)

    def read_and_build() -> tuple[SamplingParams, list[NewRequest], Prepared]:
        params = body.to_sampling_params()
        return params, *build(request_id, params, options)

    params, requests, prepared = await prepare(request_id, read_and_build)
    if render is not None:  # the engine requests shown, not run: `render` picks the body from them
        return JSONResponse(render([rendered(body.model, request, client.max_model_len) for request in requests]))
    gen = Generation(client, request_id, requests)
    streamed = False
    try:
        answer = reply(gen, params, prepared)
        version = {WEIGHT_VERSION_HEADER: gen.weight_version}
        if body.streaming:
            # A constraint's grammar is compiled by the engine: a stream commits to its status only
            # once it is known to compile (a 400 otherwise), which the first output shows.
            # So does a decode whose prompt's blocks are pulled: the prefill side may refuse them (a 400).
            pulls = transfer is not None and transfer.do_remote_prefill
            if (params.structured_outputs is not None or pulls) and await cancel_on_disconnect(
                http, gen.started()
            ) is DISCONNECTED:
                return client_closed()
            streamed = True
            return GenerationStream(gen, answer.stream(), media_type="text/event-stream", headers=version)
        finals = await cancel_on_disconnect(http, gen.finals())
        if finals is DISCONNECTED:
            return client_closed()
        body_out = {**answer.body(finals), "weight_version": gen.weight_version}
        if transfer is not None:  # vLLM's answer to its router: where the prompt's blocks are (or null)
            body_out["kv_transfer_params"] = finals[0].kv_transfer_params
        return JSONResponse(body_out, headers=version)
    finally:
        if not streamed:
            gen.close()


def rendered(model: str, request: NewRequest, max_model_len: int) -> dict:
    """A request as /v1/*completions/render shows it (vLLM's token-in request): the prompt's token ids
    as the engine would get them, and the sampling limits as resolved (max_tokens filled in)."""
    params, tokens = request.core.params, request.prompt_token_ids
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - len(tokens)
    sampling = {"max_tokens": max_tokens, "temperature": params.temperature, "top_p": params.top_p, "n": params.n}
    return {"model": model, "token_ids": tokens, "features": None, "sampling_params": sampling}


class GenerationStream(StreamingResponse):
    """A streamed call's response: whatever ends it (its last event, the client leaving before
    or during the stream, an error), the call's requests end with it."""

    def __init__(self, gen: Generation, content: AsyncIterator[str], **kwargs):
        super().__init__(content, **kwargs)
        self.generation = gen

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.generation.close()


async def prepare(request_id: str, build: Callable[[], Prepared]) -> Prepared:
    """Runs `build` (rendering the chat template, tokenizing: seconds for a long prompt) in a
    thread. A value the request got wrong raises ArgosyError (a 400); anything else is a bug
    this request met: it alone fails, with a 500 and an error log naming it."""
    try:
        return await asyncio.to_thread(build)
    except ArgosyError:
        raise
    except Exception as exc:
        log.exception("request %s failed while preparing its prompt", request_id)
        raise EngineFailedError(f"preparing the prompt failed: {type(exc).__name__}: {exc}") from exc


class Generation:
    """The engine requests of one API call (one per prompt), submitted all or none. It keeps
    counts for usage and the access log, not the text: a stream's deltas go straight out."""

    def __init__(self, client: EngineClient, request_id: str, requests: list[NewRequest]):
        self.request_id = request_id
        self.requests = requests
        # Weights change only with nothing in flight: those serving now produce the whole answer.
        self.weight_version = client.weight_version
        self.prompt_tokens = sum(len(r.prompt_token_ids) for r in requests)
        self.created = int(time.time())
        self._start = time.monotonic()
        self.generated_tokens = 0
        self._cached_tokens: dict[int, int] = {}  # per prompt: its tokens found in the prefix cache
        self._first_token_time: float | None = None
        self._finish_reasons: dict[tuple[int, int], str] = {}  # (prompt, choice): reason
        self.streams: list[RequestStream] = client.submit_all(requests)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, what that prompt's request produced since the last one) as it comes.
        Leaving early aborts the rest."""
        wake, error = self.streams[0].wake, None
        try:
            while not all(s.done for s in self.streams):
                await wake.wait()
                wake.clear()
                for index, stream in enumerate(self.streams):
                    try:
                        delta = stream.take()
                    except Exception as exc:
                        error = exc
                        raise
                    if delta is not None:
                        self._count(index, delta)
                        yield index, delta
        finally:
            # Nothing here may await: when the client has gone, the server cancels this stream's
            # scope, and every await in it raises again at once.
            self.close()
            self._log(error)

    async def started(self) -> None:
        """Waits until every request has sent something; raises the error of one that failed
        (and ends the others) instead."""
        wake = self.streams[0].wake
        try:
            while not all(s.started for s in self.streams):
                await wake.wait()
                wake.clear()
        except BaseException:  # the client left (cancelled): nobody will read the outputs
            self.close()
            raise
        finally:
            wake.set()  # what arrived is still there for outputs() to take
        failed = next((s for s in self.streams if s.failed), None)
        if failed is not None:
            self.close()
            failed.take()  # raises its error

    async def finals(self) -> list[RequestOutput]:
        """Every request's whole output, once all have finished."""
        finals: dict[int, RequestOutput] = {}
        async for index, delta in self.outputs():
            if index in finals:
                merge_delta(finals[index], delta)
            else:
                finals[index] = delta
        return [finals[i] for i in range(len(self.requests))]

    def usage(self) -> dict:
        prompt, completion = self.prompt_tokens, self.generated_tokens
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(self._cached_tokens.values())},
        }

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    def _count(self, index: int, delta: RequestOutput) -> None:
        self.generated_tokens += sum(len(c.token_ids) for c in delta.outputs)
        self._cached_tokens[index] = delta.num_cached_tokens
        m = delta.metrics
        if self._first_token_time is None and m and m.first_token_time:
            self._first_token_time = m.first_token_time - m.arrival_time
        for c in delta.outputs:
            if c.finish_reason:
                self._finish_reasons[index, c.index] = c.finish_reason

    def _log(self, error: Exception | None) -> None:
        reasons = set(self._finish_reasons.values())
        if len(self._finish_reasons) < len(self.requests) * self.requests[0].params.n:
            reasons.add("error" if error else "abort")
        access_log.info(
            "request",
            extra={
                "fields": {
                    "request_id": self.request_id,
                    "prompt_tokens": self.prompt_tokens,
                    "generated_tokens": self.generated_tokens,
                    "ttft_s": round(self._first_token_time, 4) if self._first_token_time is not None else None,
                    "total_s": round(time.monotonic() - self._start, 4),
                    "finish_reason": ",".join(sorted(reasons)),
                }
            },
        )


async def cancel_on_disconnect(http: HTTPRequest, work: Awaitable):
    """Runs `work`, cancelling it if the client goes away first (its requests are aborted)."""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await http.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():  # the client left, or this handler itself was cancelled
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task.cancelled():
        return DISCONNECTED
    return task.result()


def client_closed() -> Response:
    """Nobody reads it; nginx's "client closed request" status keeps the access logs honest."""
    return Response(status_code=499)
