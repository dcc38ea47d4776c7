"""The engine core's loop between its two sockets: commands in, one message per step out,
a failing step failing its requests while the loop goes on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import zmq

from argosy.server.engine import core_protocol as protocol
from argosy.server.engine.core_process import EngineCoreProc
from argosy.server.engine.engine_core import EngineCore
from argosy.server.engine_config import EngineConfig
from argosy.server.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def core(llama_checkpoint) -> EngineCore:
    return EngineCore(EngineConfig(model=str(llama_checkpoint), dtype="float32", kv_cache_memory=8 << 20))


@contextmanager
def core_loop(core: EngineCore) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """The loop in a thread, and the API's ends of its sockets: (commands, outputs)."""
    context = zmq.Context()
    commands, commands_in = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    outputs_out, outputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    commands.bind("inproc://commands")
    commands_in.connect("inproc://commands")
    outputs.bind("inproc://outputs")
    outputs_out.connect("inproc://outputs")
    loop = threading.Thread(target=EngineCoreProc(core, commands_in, outputs_out).run)
    loop.start()
    try:
        yield commands, outputs
    finally:
        commands.send(protocol.encode(protocol.Shutdown()))
        loop.join(30)
        for sock in (commands, commands_in, outputs_out, outputs):
            sock.close(linger=0)
        context.term()


def send(sock: zmq.Socket, command: protocol.CoreCommand) -> None:
    sock.send(protocol.encode(command))


def request(request_id: str, max_tokens: int, **params) -> protocol.EngineCoreRequest:
    sampling = SamplingParams(**{"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True, **params})
    return protocol.EngineCoreRequest(request_id, [1, 2, 3, 4], sampling, time.monotonic())


def collect(outputs: zmq.Socket, until) -> list[protocol.EngineCoreOutputs]:
    """Messages until `until(messages)` holds."""
    messages: list[protocol.EngineCoreOutputs] = []
    while not until(messages):
        assert outputs.poll(30_000), "the core sent nothing for 30 s"
        messages.append(protocol.decode_message(outputs.recv()))
    return messages


def tokens_of(messages, request_id: str) -> list[int]:
    return [o.token_id for m in messages for o in m.outputs if o.request_id == request_id]


def test_each_step_sends_one_message_with_every_sequences_token(core):
    with core_loop(core) as (commands, outputs):
        send(commands, request("a", 5))
        send(commands, request("b", 3, n=2, seed=1, temperature=1.0))
        messages = collect(outputs, lambda ms: ms and ms[-1].stats.num_running == 0 and len(tokens_of(ms, "a")) == 5)
    assert len(tokens_of(messages, "b")) == 6
    steps = [m for m in messages if m.outputs]
    # Batched per step: once both run, one message carries a token of every sequence.
    assert any({(o.request_id, o.index) for o in m.outputs} == {("a", 0), ("b", 0), ("b", 1)} for m in steps)
    firsts = [o for m in messages for o in m.outputs if o.first_scheduled_time is not None]
    assert sorted((o.request_id, o.index) for o in firsts) == [("a", 0), ("b", 0), ("b", 1)]
    finals = {(o.request_id, o.index): o.finish_reason for m in messages for o in m.outputs if o.finish_reason}
    assert finals == {("a", 0): "length", ("b", 0): "length", ("b", 1): "length"}
    assert messages[-1].num_requests_received == 2 and messages[-1].stats.kv_blocks_used == 0


def test_abort_and_finish_free_the_blocks_at_the_next_step(core):
    with core_loop(core) as (commands, outputs):
        send(commands, request("long", 400))
        send(commands, request("stopped", 400))
        collect(outputs, lambda ms: ms and ms[-1].num_running_requests == 2)
        send(commands, protocol.AbortRequests(["long"]))
        send(commands, protocol.FinishSequences([("stopped", 0)]))
        last = collect(outputs, lambda ms: ms and ms[-1].num_running_requests == 0)[-1]
    assert last.stats.kv_blocks_used == 0 and not core.has_unfinished_requests()


def test_a_failing_step_fails_its_requests_and_the_loop_goes_on(core, monkeypatch):
    real_step, calls = core.step, []

    def broken_step():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected fault")
        return real_step()

    monkeypatch.setattr(core, "step", broken_step)
    with core_loop(core) as (commands, outputs):
        send(commands, request("doomed", 5))
        failed = collect(outputs, lambda ms: ms and ms[-1].failed)[-1].failed
        assert [(f.request_id, "injected fault" in f.message) for f in failed] == [("doomed", True)]
        send(commands, request("fine", 5))
        messages = collect(outputs, lambda ms: any(o.finish_reason for m in ms for o in m.outputs))
    assert len(tokens_of(messages, "fine")) == 5 and messages[-1].stats.kv_blocks_used == 0


def test_a_duplicate_request_id_fails_that_request_alone(core):
    with core_loop(core) as (commands, outputs):
        send(commands, request("twice", 50))
        send(commands, request("twice", 50))
        messages = collect(outputs, lambda ms: any(o.finish_reason for m in ms for o in m.outputs))
    failures = [f for m in messages for f in m.failed]
    assert [f.request_id for f in failures] == ["twice"] and "already in use" in failures[0].message
    assert len(tokens_of(messages, "twice")) == 50
