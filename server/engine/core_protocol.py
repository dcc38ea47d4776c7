"""What crosses between the API process and the engine core: requests and aborts one way,
one batch of outputs per step the other, all as msgspec structs in MessagePack. The offline
engine passes the same structs without encoding them.

The core works in tokens only: text, stop strings and logprob token texts stay with the API
process, which tells the core when a stop string ended a sequence."""

from __future__ import annotations

import msgspec

from argosy.server.engine.request_options import PLAIN, RequestOptions
from argosy.server.exceptions import EngineFailedError, InvalidRequestError
from argosy.server.executor.plan import TokenLogprobs
from argosy.server.kv_transfer.params import KVTransferParams
from argosy.server.lora.request import AdapterRef
from argosy.server.outputs import EngineStats
from argosy.server.sampling_params import SamplingParams


class EngineCoreRequest(msgspec.Struct, array_like=True, tag=True):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    options: RequestOptions = PLAIN


class AbortRequests(msgspec.Struct, array_like=True, tag=True):
    request_ids: list[str]


class FinishSequences(msgspec.Struct, array_like=True, tag=True):
    """Sequences (request id, output index) that the API process ended on a stop string."""

    sequences: list[tuple[str, int]]


class LoadAdapter(msgspec.Struct, array_like=True, tag=True):
    """An adapter now served by name: read it into host memory (served again if retired)."""

    ref: AdapterRef


class RetireAdapter(msgspec.Struct, array_like=True, tag=True):
    """No name stands for these weights any more: they go once no request uses them."""

    digest: str


class UpdateWeights(msgspec.Struct, array_like=True, tag=True):
    """Swap in the checkpoint at `model_path` (nothing in flight); answered by ControlDone."""

    model_path: str


class Sleep(msgspec.Struct, array_like=True, tag=True):
    """Free the KV cache (level 1) and the weights (level 2); answered by ControlDone."""

    level: int


class WakeUp(msgspec.Struct, array_like=True, tag=True):
    """Bring back what Sleep freed; answered by ControlDone."""


Control = UpdateWeights | Sleep | WakeUp


class Shutdown(msgspec.Struct, array_like=True, tag=True):
    pass


class Ping(msgspec.Struct, array_like=True, tag=True):
    """Asks an idle core for a message. The core's own loop answers it (every pass of the loop
    that takes commands sends one), so the answer proves the loop turns, not just the process."""


CoreCommand = (
    EngineCoreRequest | AbortRequests | FinishSequences | LoadAdapter | RetireAdapter | Control | Shutdown | Ping
)


class EngineCoreOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    """A step's new tokens of one sequence (one, or several when a step keeps more). The
    fields after `stop_reason` are sent with a request's first tokens only."""

    request_id: str
    index: int  # which of the request's n outputs
    new_token_ids: list[int]
    logprobs: list[TokenLogprobs] | None = None  # one per new token
    finish_reason: str | None = None  # "stop" or "length": the core's own reasons
    stop_reason: int | None = None  # the stop token id that ended it
    num_cached_tokens: int = 0
    first_scheduled_time: float | None = None
    kv_transfer_params: KVTransferParams | None = None  # with its last tokens: where its blocks are kept


class RequestFailed(msgspec.Struct, array_like=True):
    request_id: str
    message: str
    invalid: bool = False  # the request's own fault (a grammar that does not compile): a 4xx
    param: str | None = None  # the field at fault, when invalid
    status: int = 400  # when invalid: 429 where it may be retried as it is
    code: str | None = None

    @classmethod
    def of(cls, request_id: str, error: InvalidRequestError) -> RequestFailed:
        return cls(request_id, str(error), True, error.param, error.status, error.code)


def failure_error(failure: RequestFailed) -> Exception:
    """What a failed request raises to whoever waits for it."""
    if failure.invalid:
        error = InvalidRequestError(failure.message, param=failure.param)
        error.status, error.code = failure.status, failure.code
        return error
    return EngineFailedError(failure.message)


class EngineCoreOutputs(msgspec.Struct, array_like=True, tag=True):
    """What one iteration of the core loop changed: the step's tokens, requests that failed,
    and the core's figures after it."""

    outputs: list[EngineCoreOutput]
    failed: list[RequestFailed]
    stats: EngineStats
    num_waiting_requests: int
    num_running_requests: int
    num_requests_received: int  # since the core started: the API counts what is still in transit
    num_steps: int = 0  # steps finished since the core started
    step_seconds: float | None = None  # how long this iteration's step took; None: no step ran


class ControlDone(msgspec.Struct, array_like=True, tag=True):
    """How a Control command ended: `error` None when it did; `invalid` when the command itself
    was at fault (a checkpoint that does not match), not the engine."""

    error: str | None = None
    invalid: bool = False
    freed_bytes: int = 0  # by a Sleep


class CoreReady(msgspec.Struct, array_like=True, tag=True):
    stats: EngineStats
    startup: str  # the startup report line
    kv_events_bound: tuple[str, str | None] | None = None  # KV events' endpoints as bound (PUB, replay)


class CoreFailed(msgspec.Struct, array_like=True, tag=True):
    """The core cannot go on (the model did not load, or the device cannot run a step); it
    exits with `exit_code` after sending this."""

    message: str
    exit_code: int


CoreMessage = EngineCoreOutputs | ControlDone | CoreReady | CoreFailed

encode = msgspec.msgpack.Encoder().encode


def encode_command(command: CoreCommand) -> bytes:
    """A command from a client's request, encoded: text that is not Unicode (a lone surrogate,
    which JSON's escapes allow) is the request's fault, a 400; anything else that cannot cross is
    a bug, a 500. Nothing is sent either way."""
    try:
        return encode(command)
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"the request holds text that is not valid Unicode ({exc.reason})") from exc
    except (OverflowError, msgspec.EncodeError) as exc:
        raise EngineFailedError(f"the request cannot be sent to the engine core: {exc}") from exc


decode_command = msgspec.msgpack.Decoder(CoreCommand).decode
decode_message = msgspec.msgpack.Decoder(CoreMessage).decode
