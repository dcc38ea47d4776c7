"""What the two generation endpoints share: request ids, one engine request per prompt with
their output streams merged, cancellation on client disconnect, and the access-log line."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable

from fastapi import Request as HTTPRequest
from fastapi.responses import Response

from argosy.server.api.engine_client import EngineClient, RequestStream
from argosy.server.api.error_responses import APIError
from argosy.server.engine.input_processor import NewRequest
from argosy.server.outputs import RequestOutput

access_log = logging.getLogger("argosy.access")
DISCONNECTED = object()  # what cancel_on_disconnect returns when the client went away


def new_request_id(http: HTTPRequest, prefix: str) -> str:
    """The id reported to the client: its X-Request-Id if it sent one. Engine requests get
    ids of their own (`engine_request_id`), so a repeated header can never collide."""
    return http.headers.get("x-request-id") or f"{prefix}-{uuid.uuid4().hex}"


def engine_request_id(request_id: str, index: int = 0) -> str:
    return f"{request_id}-{index}-{uuid.uuid4().hex[:12]}"


def check_model(requested: str, served: str) -> None:
    if requested != served:
        raise APIError(
            404, f"The model `{requested}` does not exist.", "invalid_request_error", "model", "model_not_found"
        )


class Generation:
    """The engine requests of one API call (one per prompt), submitted all or none."""

    def __init__(self, client: EngineClient, request_id: str, requests: list[NewRequest]):
        self.request_id = request_id
        self.requests = requests
        self.latest: dict[int, RequestOutput] = {}
        self.created = int(time.time())
        self._start = time.monotonic()
        self.streams: list[RequestStream] = client.submit_all(requests)

    async def outputs(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(prompt index, cumulative output) as they come. Leaving early aborts the rest."""
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            try:
                async for output in stream:
                    await queue.put((index, output))
            except Exception as exc:
                await queue.put((index, exc))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(self.streams)]
        remaining, error = len(self.streams), None
        try:
            while remaining:
                index, item = await queue.get()
                if isinstance(item, Exception):
                    error = item
                    raise item
                self.latest[index] = item
                remaining -= item.finished
                yield index, item
        finally:
            # Everything that must happen before the first await: when the client has gone, the
            # server cancels this stream's scope, and every await in it raises again at once.
            for task in tasks:
                task.cancel()
            self.close()
            self._log(error)
            await asyncio.gather(*tasks, return_exceptions=True)

    async def finals(self) -> list[RequestOutput]:
        async for _ in self.outputs():
            pass
        return [self.latest[i] for i in range(len(self.requests))]

    def close(self) -> None:
        for stream in self.streams:
            stream.close()

    def _log(self, error: Exception | None) -> None:
        outputs = list(self.latest.values())
        first_tokens = [
            o.metrics.first_token_time - o.metrics.arrival_time
            for o in outputs
            if o.metrics and o.metrics.first_token_time
        ]
        reasons = [c.finish_reason or ("error" if error else "abort") for o in outputs for c in o.outputs]
        access_log.info(
            "request",
            extra={
                "fields": {
                    "request_id": self.request_id,
                    "prompt_tokens": sum(len(r.prompt_token_ids) for r in self.requests),
                    "generated_tokens": sum(len(c.token_ids) for o in outputs for c in o.outputs),
                    "ttft_s": round(min(first_tokens), 4) if first_tokens else None,
                    "total_s": round(time.monotonic() - self._start, 4),
                    "finish_reason": ",".join(sorted(set(reasons))) or ("error" if error else "abort"),
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
