"""GrammarGate: a constrained request waits here, unscheduled, until its grammar is ready where it
is used. First the engine's GrammarCompiler proves, in a process of its own, that the constraint
compiles within the time limit (or fails the request with a 400); then the constraint goes to the
device side in the next step plan, which compiles it for its own use, and a step result says when
it has. Only then is the request admitted, so that no step waits for a compile."""

from __future__ import annotations

from argosy.server.engine.core_protocol import RequestFailed
from argosy.server.engine.sequence import Request
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.plan import StepResult
from argosy.server.structured.grammar_compiler import GrammarCompiler
from argosy.server.structured.params import StructuredOutputsParams


class GrammarGate:
    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self.proving: list[Request] = []  # their grammar compiles in its process
        self.on_device: dict[str, list[Request]] = {}  # by key: their grammar compiles on the device side
        self.to_send: dict[str, StructuredOutputsParams] = {}  # for the next plan

    def add(self, request: Request, client: str | None) -> None:
        """Holds a constrained request back; raises TooManyRequestsError (nothing held) when its
        client has its share of compiles queued."""
        self.compiler.submit(request.params.structured_outputs, client)
        request.waiting_for_grammar = True
        self.proving.append(request)

    def remove(self, request: Request) -> None:
        """A request that went while it waited (its compile stops if nobody else waits for it)."""
        if not request.waiting_for_grammar:
            return
        request.waiting_for_grammar = False
        params = request.params.structured_outputs
        if request in self.proving:
            self.proving.remove(request)
            self.compiler.release(params)
        else:
            self.on_device[params.key].remove(request)

    def check(self, now: float) -> list[tuple[Request, Exception]]:
        """Sends on the requests whose grammar proved to compile; returns those whose compile
        failed or ran past the limit, with why (they are no longer held)."""
        if not self.proving and not self.compiler.jobs and not self.compiler.orphans:  # most steps
            return []
        self.compiler.poll(now)
        failed = []
        for request in list(self.proving):
            params = request.params.structured_outputs
            try:
                proven = self.compiler.ready(params)
            except InvalidRequestError as exc:
                self.remove(request)
                failed.append((request, exc))
                continue
            if proven:
                self.proving.remove(request)
                self.compiler.release(params)
                self.on_device.setdefault(params.key, []).append(request)
                self.to_send[params.key] = params
        return failed

    def take_to_send(self) -> list[StructuredOutputsParams]:
        if not self.to_send:
            return []
        sending, self.to_send = list(self.to_send.values()), {}
        return sending

    def device_side(self, result: StepResult) -> list[RequestFailed]:
        """Admits the requests whose grammar the device side has compiled; fails those whose
        grammar it could not (a fault of the server's: a 500)."""
        if not result.grammars_ready and not result.grammar_errors:  # most steps
            return []
        failed = []
        for key in result.grammars_ready:
            for request in self.on_device.pop(key, ()):
                request.waiting_for_grammar = False
        for key, message in result.grammar_errors.items():
            for request in self.on_device.pop(key, ()):
                request.waiting_for_grammar = False
                failed.append(RequestFailed(request.request_id, message))
        return failed

    @property
    def device_busy(self) -> bool:
        """A grammar is on its way to the device side or compiling there."""
        return bool(self.to_send) or any(self.on_device.values())

    def wait(self, timeout: float) -> None:
        """Blocks until a proving compile finishes, or `timeout` seconds pass."""
        self.compiler.wait_any(timeout)
