"""RequestStream: where the engine's outputs for one request wait for the HTTP handler.

The engine produces a delta per step whatever the client does; a stream holds at most one
output, the merge of every delta not yet taken, so what a request can hold is bounded by its
own output. Past `StreamLimits` (too much unread, or unread for too long: a client that
stopped reading) the request is aborted, its KV blocks freed, and the stream ends with
StreamStalledError."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from argosy.server.exceptions import ArgosyError
from argosy.server.outputs import RequestOutput


class StreamStalledError(ArgosyError):
    """The client did not read its output: the request was aborted to free its memory."""


@dataclass(frozen=True)
class StreamLimits:
    max_unread_tokens: int  # tokens and logprob alternatives waiting for the handler
    stall_timeout: float  # seconds an output may wait unread


def output_size(output: RequestOutput) -> int:
    """What an output holds, in tokens: each token, and each logprob alternative with it."""
    return sum(len(c.token_ids) + sum(map(len, c.logprobs or ())) for c in output.outputs)


def merge_delta(into: RequestOutput, delta: RequestOutput) -> None:
    """Appends `delta` (a later DELTA output of the same request) to `into`."""
    choices = {c.index: c for c in into.outputs}
    for new in delta.outputs:
        old = choices.get(new.index)
        if old is None:
            into.outputs.append(new)
            continue
        old.text += new.text
        old.token_ids += new.token_ids
        if new.logprobs is not None:  # each delta's lists are its own: the OutputProcessor hands them over
            if old.logprobs is None:
                old.logprobs = new.logprobs
            else:
                old.logprobs += new.logprobs
        old.cumulative_logprob = new.cumulative_logprob
        old.finish_reason, old.stop_reason = new.finish_reason, new.stop_reason
    into.outputs.sort(key=lambda c: c.index)
    into.finished, into.metrics, into.num_cached_tokens = delta.finished, delta.metrics, delta.num_cached_tokens
    into.kv_transfer_params = delta.kv_transfer_params or into.kv_transfer_params


class RequestStream:
    """One submitted request's outputs. `wake` is set whenever something arrives (the
    streams of one API call share it); `take` hands over what waits."""

    def __init__(self, request_id: str, wake: asyncio.Event, limits: StreamLimits, forget: Callable[[str, bool], None]):
        self.request_id, self.wake, self.limits = request_id, wake, limits
        self._forget = forget  # (request id, finished): the client drops it, aborting it unless finished
        self._pending: RequestOutput | Exception | None = None
        self._unread = 0
        self._unread_since = 0.0
        self.done = False  # finished, failed or closed: nothing more will come

    def put(self, item: RequestOutput | Exception, now: float) -> None:
        if self.done or isinstance(self._pending, Exception):
            return
        if isinstance(item, Exception) or self._pending is None:
            self._pending, self._unread_since = item, now
        else:
            merge_delta(self._pending, item)
        if isinstance(item, RequestOutput):
            self._unread += output_size(item)
            if not item.finished:
                self._check_limits(now)
        self.wake.set()

    def _check_limits(self, now: float) -> None:
        limits = self.limits
        if self._unread > limits.max_unread_tokens:
            why = f"{self._unread} tokens of output waited unread (the limit is {limits.max_unread_tokens})"
        elif now - self._unread_since > limits.stall_timeout:
            why = f"output waited unread for more than {limits.stall_timeout:g} s"
        else:
            return
        self._forget(self.request_id, False)
        self._pending = StreamStalledError(f"the client stopped reading its stream: {why}; the request was aborted")

    @property
    def started(self) -> bool:
        """Something arrived (an output or the error that ended it) and was not taken yet, or it ended."""
        return self._pending is not None or self.done

    @property
    def failed(self) -> bool:
        return isinstance(self._pending, Exception)

    def take(self) -> RequestOutput | None:
        """What arrived since the last take (merged), or None; raises the error that ended it."""
        item, self._pending, self._unread = self._pending, None, 0
        if isinstance(item, Exception):
            self.done = True
            raise item
        if item is not None and item.finished:
            self.done = True
        return item

    def close(self) -> None:
        """The handler stops reading: the request is aborted unless it already finished."""
        self._forget(self.request_id, self.done)
        self.done = True
