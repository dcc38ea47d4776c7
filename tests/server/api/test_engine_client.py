"""How the API process routes the core's messages: a request the core reports as failed ends
with EngineFailedError (a 500 in OpenAI's shape), and a stop string found here tells the core
to end that sequence. The core's end of the sockets is tested in test_core_process.py; here
the client is fed the core's messages directly."""

from __future__ import annotations

import asyncio

import pytest

from argosy.server.api.engine_client import EngineClient, EngineFailedError
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


class SentCommands:
    """What the client sends the core, kept instead of sent (the CoreClient's `send`)."""

    def __init__(self):
        self.sent: list[protocol.CoreCommand] = []

    def send(self, command: protocol.CoreCommand) -> None:
        self.sent.append(command)


@pytest.fixture
def client(llama_checkpoint) -> EngineClient:
    inputs = InputProcessor.for_model(EngineConfig(model=str(llama_checkpoint)))
    ready = protocol.CoreReady(STATS, "")
    return EngineClient(SentCommands(), inputs, ready, 4, ServerMetrics("tiny"), StreamLimits(1000, 60.0))


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
    client._on_message(outputs(*(protocol.EngineCoreOutput("s", 0, t) for t in ids)))
    (final,) = await asyncio.wait_for(gen.finals(), 10)
    assert final.finished and final.outputs[0].text == " one" and final.outputs[0].stop_reason == " two"
    assert client.core.sent[-1] == protocol.FinishSequences([("s", 0)])
