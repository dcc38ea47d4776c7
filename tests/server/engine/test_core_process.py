"""The engine core's loop between its two sockets: commands in, one message per step out (a
ping answered too), a failing step failing its requests while the loop goes on, unless the
device then cannot run a step: the loop ends and says why."""

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
from argosy.server.worker import sampler


@pytest.fixture(scope="module")
def core(llama_checkpoint) -> EngineCore:
    return EngineCore(EngineConfig(model=str(llama_checkpoint), dtype="float32", kv_cache_memory=8 << 20))


@contextmanager
def core_loop(core: EngineCore, exit_codes: list | None = None) -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """The loop in a thread, and the API's ends of its sockets: (commands, outputs); what the
    loop returns goes into `exit_codes`."""
    context = zmq.Context()
    commands, commands_in = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    outputs_out, outputs = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    commands.bind("inproc://commands")
    commands_in.connect("inproc://commands")
    outputs.bind("inproc://outputs")
    outputs_out.connect("inproc://outputs")
    proc = EngineCoreProc(core, commands_in, outputs_out)
    codes = exit_codes if exit_codes is not None else []
    loop = threading.Thread(target=lambda: codes.append(proc.run()))
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


def collect(outputs: zmq.Socket, until) -> list[protocol.CoreMessage]:
    """Messages until `until(messages)` holds."""
    messages: list[protocol.EngineCoreOutputs] = []
    while not until(messages):
        assert outputs.poll(30_000), "the core sent nothing for 30 s"
        messages.append(protocol.decode_message(outputs.recv()))
    return messages


def tokens_of(messages, request_id: str) -> list[int]:
    return [t for m in messages for o in m.outputs if o.request_id == request_id for t in o.new_token_ids]


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


def test_an_idle_core_answers_a_ping_from_its_loop(core):
    with core_loop(core) as (commands, outputs):
        send(commands, protocol.Ping())
        (answer,) = collect(outputs, lambda ms: ms)
    assert answer.outputs == [] and answer.failed == [] and answer.step_seconds is None


def test_messages_count_the_steps_and_time_each(core):
    with core_loop(core) as (commands, outputs):
        send(commands, request("a", 3))
        messages = collect(outputs, lambda ms: len(tokens_of(ms, "a")) == 3)
    steps = [m for m in messages if m.step_seconds is not None]
    assert [m.num_steps for m in steps] == list(range(steps[0].num_steps, steps[0].num_steps + len(steps)))
    assert len(steps) >= 3 and all(m.step_seconds > 0 for m in steps)


def test_a_request_whose_sampling_fails_fails_alone(core, monkeypatch):
    with core_loop(core) as (commands, outputs):
        send(commands, request("alone", 5))
        alone = tokens_of(collect(outputs, lambda ms: len(tokens_of(ms, "alone")) == 5), "alone")
    draw = sampler.draw

    def poisoned(probs, seqs):
        if any(s.request_id == "poison" for s in seqs):
            raise RuntimeError("injected fault")
        return draw(probs, seqs)

    monkeypatch.setattr(sampler, "draw", poisoned)
    with core_loop(core) as (commands, outputs):
        send(commands, request("poison", 5, temperature=1.0, seed=1))
        send(commands, request("fine", 5))
        messages = collect(outputs, lambda ms: len(tokens_of(ms, "fine")) == 5)
    failures = [(f.request_id, f.message) for m in messages for f in m.failed]
    assert failures == [("poison", "sampling failed: RuntimeError: injected fault")]
    assert tokens_of(messages, "poison") == [] and tokens_of(messages, "fine") == alone
    assert messages[-1].stats.kv_blocks_used == 0 and not core.has_unfinished_requests()


def test_a_failed_step_on_a_device_that_cannot_step_ends_the_loop(core, monkeypatch):
    def broken(*args):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(core, "step", broken)
    monkeypatch.setattr(core, "check_device", broken)
    codes: list[int] = []
    with core_loop(core, codes) as (commands, outputs):
        send(commands, request("doomed", 5))
        messages = collect(outputs, lambda ms: ms and isinstance(ms[-1], protocol.CoreFailed))
    assert [f.request_id for f in messages[-2].failed] == ["doomed"]
    assert messages[-1].message.startswith("the device cannot run a step after a failed one: RuntimeError: CUDA error")
    assert codes == [messages[-1].exit_code] == [70] and not core.has_unfinished_requests()
