"""Executor: what the engine asks of the device side, whichever executor owns the workers. `start`
loads the model, profiles the largest step, allocates the KV cache and captures graphs; `execute`
runs one StepPlan and samples (`execute_async`: starts it and returns a handle to its result,
so that the engine can plan the next step meanwhile); `check_device` runs a one-token step to tell a broken batch from a
broken device; `add_adapter` reads a LoRA adapter into the workers' host memory (by digest; the
plans' slot loads copy from there) and `remove_adapter` lets it go, as the engine's LoRAManager
decides. Between steps, with nothing in flight: `update_weights` swaps in a checkpoint's weights,
`sleep` frees the KV cache (and the weights), `wake_up` brings them back.

Every method is a call of worker_calls.py, which crosses to the workers as a message: only plain
data crosses (plans, results, adapter references, paths, levels), never a live object. Two
executors run them, as vLLM's backends: `uni`, one worker in the engine's own process
(in_process.py, the default with one rank), and `mp`, every rank a process of its own
(multiproc.py; tensor parallelism always)."""

from __future__ import annotations

from typing import Any, Protocol

from argosy.server.executor.plan import DeviceReady, StepPlan, StepResult
from argosy.server.executor.worker_calls import (
    AddAdapter,
    CheckDevice,
    Execute,
    RemoveAdapter,
    Sleep,
    Start,
    UpdateWeights,
    WakeUp,
    WorkerCall,
)
from argosy.server.lora.request import AdapterRef


class StepHandle(Protocol):
    def result(self) -> StepResult:
        """The step's result, waited for; raises what the step raised."""
        ...


class Done:
    """The handle of a step that has run already."""

    def __init__(self, result: StepResult):
        self._result = result

    def result(self) -> StepResult:
        return self._result


class Executor:
    def start(self) -> DeviceReady:
        return self.call(Start())

    def execute(self, plan: StepPlan) -> StepResult:
        return self.execute_async(plan).result()

    def execute_async(self, plan: StepPlan) -> StepHandle:
        """Starts the step and returns its handle; the steps run in the order they are started
        (here: at once, before this returns; the executors that can start it and return do)."""
        return Done(self.call(Execute(plan)))

    def check_device(self) -> None:
        self.call(CheckDevice())

    def add_adapter(self, ref: AdapterRef) -> None:
        self.call(AddAdapter(ref))

    def remove_adapter(self, digest: str) -> None:
        self.call(RemoveAdapter(digest))

    def update_weights(self, path: str) -> None:
        self.call(UpdateWeights(path))

    def sleep(self, level: int) -> int:
        return self.call(Sleep(level))

    def wake_up(self) -> None:
        self.call(WakeUp())

    def shutdown(self) -> None:
        """Stops the workers (nothing to do in-process)."""

    def call(self, call: WorkerCall) -> Any:
        """Runs `call` on every worker; the result of rank 0's."""
        raise NotImplementedError
