"""What an executor says to its workers, and what they answer: plain messages, each call's tag the
name of the Worker method it runs (its fields, in order, the arguments). Both executors speak it,
the in-process one too, so that what works in one process works across processes. An error
crosses as its class's name, message and field, and is raised again on the executor's side as
the same kind of error (a bad adapter stays a 400, a missing checkpoint keeps its exit code)."""

from __future__ import annotations

import logging
import traceback
from typing import Any

import msgspec

from argosy.server import exceptions
from argosy.server.executor.plan import DeviceReady, StepPlan, StepResult
from argosy.server.lora.request import AdapterRef

log = logging.getLogger("argosy.engine")


class Start(msgspec.Struct, tag="start", array_like=True):
    pass


class Execute(msgspec.Struct, tag="execute", array_like=True):
    plan: StepPlan


class CheckDevice(msgspec.Struct, tag="check_device", array_like=True):
    pass


class AddAdapter(msgspec.Struct, tag="add_adapter", array_like=True):
    ref: AdapterRef


class RemoveAdapter(msgspec.Struct, tag="remove_adapter", array_like=True):
    digest: str


class UpdateWeights(msgspec.Struct, tag="update_weights", array_like=True):
    path: str


class Sleep(msgspec.Struct, tag="sleep", array_like=True):
    level: int


class WakeUp(msgspec.Struct, tag="wake_up", array_like=True):
    pass


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


WorkerCall = Start | Execute | CheckDevice | AddAdapter | RemoveAdapter | UpdateWeights | Sleep | WakeUp | Shutdown
RESULT_TYPES: dict[type, Any] = {Start: DeviceReady, Execute: StepResult | None, Sleep: int}


class RemoteError(msgspec.Struct, array_like=True):
    kind: str  # the class's name
    message: str
    param: str | None = None  # an InvalidRequestError's field
    exit_code: int = 1
    traceback: str = ""


class WorkerReply(msgspec.Struct, array_like=True):
    value: msgspec.Raw = msgspec.Raw(b"\xc0")  # the call's result, encoded (nil: None)
    error: RemoteError | None = None


encode = msgspec.msgpack.Encoder().encode
decode_call = msgspec.msgpack.Decoder(WorkerCall).decode
_decode_reply = msgspec.msgpack.Decoder(WorkerReply).decode


_METHODS = {cls: (cls.__struct_config__.tag, cls.__struct_fields__) for cls in WorkerCall.__args__}


def dispatch(worker: object, call: WorkerCall) -> Any:
    """Runs `call` on `worker`: the method its tag names, with its fields."""
    method, fields = _METHODS[type(call)]
    return getattr(worker, method)(*[getattr(call, name) for name in fields])


def run_call(worker: object, call: WorkerCall) -> bytes:
    """Runs `call` on `worker`; its reply, encoded, whatever happened."""
    try:
        value = dispatch(worker, call)
        return encode(WorkerReply(msgspec.Raw(encode(value))))
    except Exception as exc:
        if isinstance(call, Start) or not isinstance(exc, exceptions.ArgosyError):  # its traceback in the log
            log.exception("%s failed on this rank", type(call).__name__)
        error = RemoteError(
            type(exc).__name__,
            str(exc),
            getattr(exc, "param", None),
            getattr(exc, "exit_code", 1),
            traceback.format_exc(),
        )
        return encode(WorkerReply(error=error))


def read_reply(call: WorkerCall, reply: bytes) -> Any:
    """The call's result from its encoded reply; raises the error it carries, as its own kind."""
    decoded = _decode_reply(reply)
    if decoded.error is not None:
        raise remote_error(decoded.error)
    return msgspec.msgpack.decode(decoded.value, type=RESULT_TYPES.get(type(call), Any))


def remote_error(error: RemoteError) -> Exception:
    """The worker's error as the executor's side raises it: the same class where it is one of the
    engine's own (InvalidRequestError and its kinds, CheckpointError and its kinds), else a
    RuntimeError naming the class."""
    cls = getattr(exceptions, error.kind, None)
    if error.kind == "AdapterError":
        cls = exceptions.InvalidRequestError
    if not (isinstance(cls, type) and issubclass(cls, exceptions.ArgosyError)):
        return RuntimeError(f"{error.kind}: {error.message}")
    raised = cls.__new__(cls)
    Exception.__init__(raised, error.message)
    raised.param, raised.exit_code = error.param, error.exit_code
    return raised
