"""RequestStream: deltas a handler has not taken yet are merged into one output, and a request
whose client stops reading is aborted past its limits, rather than buffered without end."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from argosy.server.api.error_responses import sse_error
from argosy.server.api.request_stream import RequestStream, StreamLimits, StreamStalledError, merge_delta
from argosy.server.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput


def delta(step: int, finished: bool = False, n: int = 2, logprobs: int = 0) -> RequestOutput:
    """Step `step` of a request with n choices: one token each, `logprobs` alternatives."""
    choices = [
        CompletionOutput(
            i,
            f"<{step}.{i}>",
            [step * 10 + i],
            cumulative_logprob=-float(step),
            logprobs=[{step * 10 + i + k: Logprob(-1.0, k) for k in range(logprobs + 1)}],
            finish_reason="length" if finished else None,
        )
        for i in range(n)
    ]
    return RequestOutput("r", None, [1, 2], choices, finished, metrics=RequestMetrics(0.0))


class Forgotten:
    def __init__(self):
        self.calls: list[tuple[str, bool]] = []

    def __call__(self, request_id: str, finished: bool) -> None:
        self.calls.append((request_id, finished))


def stream(max_unread: int = 1000, stall: float = 60.0) -> tuple[RequestStream, Forgotten]:
    forgotten = Forgotten()
    return RequestStream("r", asyncio.Event(), StreamLimits(max_unread, stall), forgotten), forgotten


def test_deltas_waiting_unread_come_out_as_one_output_equal_to_their_concatenation():
    s, forgotten = stream()
    steps = [delta(step, finished=step == 4) for step in range(5)]
    merged = copy.deepcopy(steps[0])
    for d in steps[1:]:
        merge_delta(merged, copy.deepcopy(d))
    for step, d in enumerate(steps):
        s.put(d, now=float(step))
    assert s.wake.is_set()
    taken = s.take()
    assert taken == merged and s.done and s.take() is None
    assert [c.text for c in taken.outputs] == ["".join(f"<{k}.{i}>" for k in range(5)) for i in range(2)]
    assert [c.token_ids for c in taken.outputs] == [[k * 10 + i for k in range(5)] for i in range(2)]
    assert taken.outputs[0].finish_reason == "length" and taken.finished
    s.close()
    assert forgotten.calls == [("r", True)]  # finished: dropped, not aborted


def test_a_stream_taken_as_it_comes_holds_nothing_between_takes():
    s, _ = stream(max_unread=4)
    for step in range(10):  # 2 tokens and 2 logprobs a step: at the limit, never past it
        s.put(delta(step), now=float(step))
        assert s.take().outputs[0].token_ids == [step * 10]
    assert not s.done


@pytest.mark.parametrize("logprobs", [0, 4])
def test_too_much_unread_output_aborts_the_request(logprobs):
    s, forgotten = stream(max_unread=30)
    per_step = 2 * (1 + logprobs + 1)  # 2 choices: the token and its entry's alternatives
    steps = 30 // per_step + 1
    for step in range(steps):
        s.put(delta(step, logprobs=logprobs), now=0.0)
    assert forgotten.calls == [("r", False)]
    s.put(delta(steps), now=0.0)  # what was on its way when the abort went out: dropped
    with pytest.raises(StreamStalledError, match="unread"):
        s.take()
    assert s.done


def test_output_unread_past_the_stall_timeout_aborts_the_request():
    s, forgotten = stream(stall=5.0)
    s.put(delta(0), now=100.0)
    s.put(delta(1), now=104.0)
    assert not forgotten.calls
    s.take()
    s.put(delta(2), now=108.0)  # the clock restarts once the handler reads
    assert not forgotten.calls
    s.put(delta(3), now=113.5)
    assert forgotten.calls == [("r", False)]
    with pytest.raises(StreamStalledError, match="5 s"):
        s.take()


def test_a_final_output_is_kept_whatever_the_limits():
    s, forgotten = stream(max_unread=1, stall=1.0)
    s.put(delta(0, finished=True), now=0.0)
    assert s.take().finished and not forgotten.calls


def test_a_stalled_stream_ends_with_its_own_error_event():
    event = sse_error(StreamStalledError("the client stopped reading its stream"))
    assert json.loads(event.removeprefix("data: "))["error"]["code"] == "stream_stalled"
