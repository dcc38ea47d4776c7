"""The engine core's process under `argosy serve`: it loads the model, says so (CoreReady,
or CoreFailed and the exit code), then loops. While requests are in flight it busy-loops:
take every command that arrived, run one step, send that step's outputs as one message.
Idle, it blocks on its input socket, and answers a Ping with a message of the same loop. It
ends on Shutdown, or when its parent is gone; and when a step failed and the device then
cannot run one (CoreFailed, exit code 70).

Run by the API process as `python -P -m argosy.server.engine.core_process ...`."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time

import msgspec
import zmq

from argosy.server.engine import core_protocol as protocol
from argosy.server.engine.engine_core import EngineCore
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import ArgosyError

log = logging.getLogger("argosy.engine")
PARENT_CHECK_MS = 1000  # how long an idle core waits on its socket before checking its parent
CONNECTOR_POLL_MS = 50  # and before polling its KV connector, while that waits on other replicas
DEVICE_BROKEN_EXIT_CODE = 70  # sysexits' EX_SOFTWARE, as the API process's own for a dead core


class EngineCoreProc:
    """The loop around an EngineCore, between two sockets (commands in, outputs out)."""

    def __init__(self, core: EngineCore, commands: zmq.Socket, outputs: zmq.Socket):
        self.core, self.commands, self.outputs = core, commands, outputs
        self.num_received = self.num_steps = 0
        self.parent = os.getppid()

    def run(self) -> int:
        """Serves until Shutdown or the parent's end (0), or until the device is broken."""
        while True:
            if os.getppid() != self.parent:
                log.warning("the API process is gone: the engine core stops")
                return 0
            if not self.core.has_unfinished_requests():
                waiting_on_others = self.core.kv.connector_busy  # blocks held for a pull, pulls in flight
                if not self.commands.poll(CONNECTOR_POLL_MS if waiting_on_others else PARENT_CHECK_MS):
                    if waiting_on_others:
                        self._send(self.core.poll_connector(), self.core.take_failed(), None)
                    continue
            commands = self._receive()
            if any(isinstance(c, protocol.Shutdown) for c in commands):
                return 0
            failed = [f for c in commands if (f := self._apply(c)) is not None]
            outputs: list[protocol.EngineCoreOutput] = []
            seconds = broken = None
            if self.core.has_unfinished_requests():
                started = time.monotonic()
                outputs, step_failed, broken = self._step()
                seconds = time.monotonic() - started
                self.num_steps += 1
                failed += step_failed
            self._send(outputs, failed, seconds)
            if broken is not None:
                self.outputs.send(protocol.encode(protocol.CoreFailed(broken, DEVICE_BROKEN_EXIT_CODE)))
                return DEVICE_BROKEN_EXIT_CODE

    def _receive(self) -> list[protocol.CoreCommand]:
        commands = []
        while True:
            try:
                commands.append(protocol.decode_command(self.commands.recv(zmq.NOBLOCK)))
            except zmq.Again:
                return commands

    def _apply(self, command: protocol.CoreCommand) -> protocol.RequestFailed | None:
        if isinstance(command, protocol.EngineCoreRequest):
            self.num_received += 1
            try:
                self.core.add_request(command)
            except Exception as exc:  # this request alone fails
                log.exception("could not queue request %s", command.request_id)
                return protocol.RequestFailed(command.request_id, f"could not queue the request: {exc!r}")
        elif isinstance(command, protocol.AbortRequests):
            for request_id in command.request_ids:
                self.core.abort(request_id)
        elif isinstance(command, protocol.FinishSequences):
            self.core.finish_sequences(command.sequences)
        elif isinstance(command, protocol.LoadAdapter):
            try:
                self.core.load_adapter(command.ref)
            except Exception:  # the API process checked the folder; requests naming it fail alone
                log.exception("could not read adapter %s into host memory", command.ref.name)
        elif isinstance(command, protocol.RetireAdapter):
            self.core.retire_adapter(command.digest)
        elif isinstance(command, protocol.Control):
            self.outputs.send(protocol.encode(self._control(command)))
        return None  # a Ping is answered by the message this pass of the loop sends

    def _control(self, command: protocol.Control) -> protocol.ControlDone:
        try:
            if isinstance(command, protocol.UpdateWeights):
                self.core.update_weights(command.model_path)
            elif isinstance(command, protocol.Sleep):
                return protocol.ControlDone(freed_bytes=self.core.sleep(command.level))
            else:
                self.core.wake_up()
        except ArgosyError as exc:  # the command's fault: a checkpoint that does not fit, requests in flight
            log.error("%s failed: %s", type(command).__name__, exc)
            return protocol.ControlDone(str(exc), invalid=True)
        except Exception as exc:
            log.exception("%s failed", type(command).__name__)
            return protocol.ControlDone(f"{type(command).__name__} failed: {type(exc).__name__}: {exc}")
        return protocol.ControlDone()

    def _step(self) -> tuple[list[protocol.EngineCoreOutput], list[protocol.RequestFailed], str | None]:
        """One step: its outputs, the requests that failed, and why the device is broken (None
        while it works). A step that fails as a whole fails every request in flight; then a
        one-token step tells a broken batch (serving goes on) from a broken device."""
        try:
            return self.core.step(), self.core.take_failed(), None
        except Exception as exc:  # a bug must fail its requests, not hang them or the loop
            log.exception("engine step failed")
            failed = list(self.core.requests)
            for request_id in failed:
                self.core.abort(request_id)
            failures = [protocol.RequestFailed(r, f"engine step failed: {exc!r}") for r in failed]
        try:
            self.core.check_device()
        except Exception as exc:
            log.exception("the device cannot run a step: the engine core stops")
            return [], failures, f"the device cannot run a step after a failed one: {type(exc).__name__}: {exc}"
        return [], failures, None

    def _send(
        self, outputs: list[protocol.EngineCoreOutput], failed: list[protocol.RequestFailed], seconds: float | None
    ) -> None:
        waiting, running = self.core.num_requests()
        message = protocol.EngineCoreOutputs(
            outputs, failed, self.core.stats(), waiting, running, self.num_received, self.num_steps, seconds
        )
        self.outputs.send(protocol.encode(message), copy=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="argosy-engine-core")
    parser.add_argument("--commands", required=True, help="ZeroMQ address the commands come from")
    parser.add_argument("--outputs", required=True, help="ZeroMQ address the outputs go to")
    parser.add_argument("--config", required=True, help="EngineConfig as JSON")
    parser.add_argument("--log-format", default="json")
    args = parser.parse_args(argv)
    from argosy.server.api.log_format import configure_logging

    configure_logging(args.log_format)
    # The API process decides when the core stops (after a drain): a signal sent to the whole
    # process group must not end it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    context = zmq.Context()
    commands, outputs = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    for sock, address in ((commands, args.commands), (outputs, args.outputs)):
        sock.setsockopt(zmq.LINGER, 1000)
        sock.set_hwm(0)
        sock.connect(address)
    try:
        core = EngineCore(msgspec.json.decode(args.config, type=EngineConfig))
    except Exception as exc:
        code = exc.exit_code if isinstance(exc, ArgosyError) else 1
        if not isinstance(exc, ArgosyError):
            log.exception("model failed to load")
        outputs.send(protocol.encode(protocol.CoreFailed(str(exc), code)))
        outputs.close()
        return code
    bound = None if core.kv_events is None else core.kv_events.bound_endpoints
    outputs.send(protocol.encode(protocol.CoreReady(core.stats(), core.device.startup, bound)))
    code = EngineCoreProc(core, commands, outputs).run()
    core.shutdown()
    outputs.close()
    commands.close()
    return code


if __name__ == "__main__":
    from argosy.kernels.interpreter import use_interpreter_without_cuda

    use_interpreter_without_cuda()
    sys.exit(main())
