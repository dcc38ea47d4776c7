"""How the API process routes the core's messages: a request the core reports as failed ends
with EngineFailedError (a 500 in OpenAI's shape), and a stop string found here tells the core
to end that sequence. A core that stops sending (no step's end, no ping's answer) is killed and
what is in flight fails. The core's end of the sockets is tested in test_core_process.py; here
the client is fed the core's messages directly."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from argosy.server.api.engine_client import EngineClient, EngineDeadError, EngineFailedError
from argosy.server.api.error_responses import to_api_error
from argosy.server.api.generation import Generation
from argosy.server.api.metrics import ServerMetrics
from argosy.server.api.request_stream import StreamLimits
from argosy.server.engine import core_protocol as protocol
from argosy.server.engine.input_processor import InputProcessor
from argosy.server.engine_config import EngineConfig
from argosy.server.outputs import EngineStats
from argosy.server.sampling_params import SamplingParams

STATS = EngineStats(0, 0, 10, 0, 0, 0, 0)


class ScriptedCore:
    """The CoreClient as the engine client uses it: what it is sent is kept, and its messages
    are those put into `script`, until it is killed."""

    def __init__(self):
        self.sent: list[protocol.CoreCommand] = []
        self.script: asyncio.Queue = asyncio.Queue()
        self.killed = False
        self.unread = False  # what message_waiting() says
        self.process = SimpleNamespace(returncode=None)

    def send(self, command: protocol.CoreCommand) -> None:
        self.sent.append(command)

    def send_encoded(self, frame: bytes) -> None:
        self.sent.append(protocol.decode_command(frame))

    async def messages(self):
        while (message := await self.script.get()) is not None:
            yield message

    def message_waiting(self) -> bool:
        return self.unread

    def kill(self) -> None:
        self.killed, self.process.returncode = True, -9
        self.script.put_nowait(None)


@pytest.fixture
def inputs(llama_checkpoint) -> InputProcessor:
    return InputProcessor.for_model(EngineConfig(model=str(llama_checkpoint)))


def engine_client(inputs: InputProcessor, step_timeout: float = 120.0) -> EngineClient:
    ready = protocol.CoreReady(STATS, "")
    metrics = ServerMetrics("tiny")
    return EngineClient(ScriptedCore(), inputs, ready, 4, metrics, StreamLimits(1000, 60.0), step_timeout)


@pytest.fixture
def client(inputs) -> EngineClient:
    return engine_client(inputs)


def outputs(*items, failed=(), received=1) -> protocol.EngineCoreOutputs:
    return protocol.EngineCoreOutputs(list(items), list(failed), STATS, 0, 1, received)


async def test_a_request_the_core_failed_ends_with_a_500(client):
    request = client.make_request("r", [5, 6, 7], SamplingParams(max_tokens=4))
    gen = Generation(client, "r", [request])
    assert client.core.sent == [request.core] and client.num_waiting == 1
    client._on_message(outputs(failed=[protocol.RequestFailed("r", "engine step failed: boom")]))
    with pytest.raises(EngineFailedError, match="boom") as err:
        await asyncio.wait_for(gen.finals(), 10)  # a bound, so that a lost error fails, not hangs
    error = to_api_error(err.value)
    assert (error.status, error.type) == (500, "internal_error")
    assert client.num_in_flight == 0 and not client.outputs.requests
    assert not any(isinstance(c, protocol.AbortRequests) for c in client.core.sent)  # the core dropped it


async def test_a_stop_string_found_here_ends_the_sequence_in_the_core(client):
    ids = client.tokenizer.encode(" one two three", add_special_tokens=False)
    gen = Generation(client, "s", [client.make_request("s", [5, 6], SamplingParams(max_tokens=20, stop=" two"))])
    client._on_message(outputs(*(protocol.EngineCoreOutput("s", 0, [t]) for t in ids)))
    (final,) = await asyncio.wait_for(gen.finals(), 10)
    assert final.finished and final.outputs[0].text == " one" and final.outputs[0].stop_reason == " two"
    assert client.core.sent[-1] == protocol.FinishSequences([("s", 0)])


def hangs(client: EngineClient) -> dict[str, float]:
    families = text_string_to_metric_families(client.metrics.render().decode())
    samples = [s for f in families for s in f.samples if s.name == "argosy_engine_hangs_total"]
    return {s.labels["waiting_for"]: s.value for s in samples}


async def test_an_idle_core_that_answers_no_ping_is_killed(inputs):
    client = engine_client(inputs, step_timeout=0.4)
    await asyncio.wait_for(client.run(), 10)  # ends once the hung core is killed
    assert protocol.Ping() in client.core.sent and client.core.killed
    assert client.dead.startswith("the engine core hung: it answered no ping for ")
    assert not client.healthy and hangs(client) == {"step": 0, "ping": 1, "control": 0}


async def test_a_step_that_does_not_end_fails_what_is_in_flight(inputs):
    client = engine_client(inputs, step_timeout=0.4)
    run = asyncio.ensure_future(client.run())
    gen = Generation(client, "r", [client.make_request("r", [5, 6, 7], SamplingParams(max_tokens=4))])
    with pytest.raises(EngineDeadError, match=r"step 1 has not finished after 0\.\d s .*in flight: r") as err:
        await asyncio.wait_for(gen.finals(), 10)
    assert to_api_error(err.value).status == 500
    await asyncio.wait_for(run, 10)
    assert protocol.Ping() not in client.core.sent  # work was owed: nothing to ask
    assert client.core.killed and hangs(client) == {"step": 1, "ping": 0, "control": 0}


async def test_a_message_the_loop_has_not_read_yet_is_no_hang(inputs):
    client = engine_client(inputs, step_timeout=0.4)
    run = asyncio.ensure_future(client.run())
    client.core.unread = True
    Generation(client, "r", [client.make_request("r", [5, 6, 7], SamplingParams(max_tokens=4))])
    await asyncio.sleep(1.0)  # the debt is overdue, but an answer waits unread
    assert client.dead is None and not client.core.killed
    client.core.unread = False
    client.core.script.put_nowait(outputs(protocol.EngineCoreOutput("r", 0, [9])))
    await asyncio.sleep(0.2)
    assert client.dead is None  # the answer reset the clock
    await asyncio.wait_for(run, 10)  # and silence hangs it again
    assert client.dead.startswith("the engine core hung: step")


async def test_a_core_that_cannot_go_on_says_why_and_everything_in_flight_fails(client):
    run = asyncio.ensure_future(client.run())
    gen = Generation(client, "r", [client.make_request("r", [5, 6, 7], SamplingParams(max_tokens=4))])
    client.core.script.put_nowait(protocol.CoreFailed("the device cannot run a step after a failed one: boom", 70))
    with pytest.raises(EngineDeadError, match="the engine core failed: the device cannot run a step"):
        await asyncio.wait_for(gen.finals(), 10)
    await asyncio.wait_for(run, 10)
    assert client.core.killed and not client.healthy


async def test_a_request_that_fails_here_ends_alone_and_the_core_aborts_it(client, monkeypatch):
    real_append = client.outputs._append

    def append(state, seq, out):
        if out.request_id == "bad":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real_append(state, seq, out)

    monkeypatch.setattr(client.outputs, "_append", append)
    good, bad = (
        Generation(client, r, [client.make_request(r, [5, 6], SamplingParams(max_tokens=2, ignore_eos=True))])
        for r in ("good", "bad")
    )
    client._on_message(outputs(*(protocol.EngineCoreOutput(r, 0, [9]) for r in ("good", "bad")), received=2))
    client._on_message(outputs(protocol.EngineCoreOutput("good", 0, [10], finish_reason="length"), received=2))
    with pytest.raises(EngineFailedError, match="detokenizing its output failed: UnicodeDecodeError") as err:
        await asyncio.wait_for(bad.finals(), 10)
    assert to_api_error(err.value).status == 500
    (final,) = await asyncio.wait_for(good.finals(), 10)
    assert final.outputs[0].token_ids == [9, 10] and final.outputs[0].finish_reason == "length"
    assert protocol.AbortRequests(["bad"]) in client.core.sent
    assert client.num_in_flight == 0 and not client.outputs.requests
