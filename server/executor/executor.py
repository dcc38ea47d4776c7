"""Executor: what the engine asks of the device side. `start` loads the model, profiles the
largest step, allocates the KV cache and captures graphs; `execute` runs one StepPlan and
samples; `check_device` runs a one-token step to tell a broken batch from a broken device;
`adapters` (with LoRA on, once started) holds the LoRA adapters in host memory, which the
engine has read as requests name them and the plans' slot loads copy from; `use_grammars` hands
it the grammars the engine compiles for constrained requests, by key, from which it starts each
constrained sequence's matcher (a multi-process executor would compile them again from the
constraints its plans carry, with the same cache keys). Between steps, with
nothing in flight: `update_weights` swaps in a checkpoint's weights, `sleep` frees the KV cache
(and the weights), `wake_up` brings them back.

Today one executor runs in the engine core's process (the worker package's); a multi-process
one (a worker per GPU, for tensor parallelism) takes the same plans."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.plan import DeviceReady, StepPlan, StepResult
from argosy.server.models.model_config import ModelConfig

if TYPE_CHECKING:
    from argosy.server.lora.manager import AdapterHost


class Grammars(Protocol):
    """The compiled grammars, by constraint key, and the vocabulary they were compiled for."""

    vocab_bytes: list[bytes]

    def __getitem__(self, key: str) -> Any: ...


class Executor(Protocol):
    adapters: AdapterHost | None

    def start(self) -> DeviceReady: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def check_device(self) -> None: ...

    def use_grammars(self, grammars: Grammars) -> None: ...

    def update_weights(self, path: str) -> None: ...

    def sleep(self, level: int) -> int: ...

    def wake_up(self) -> None: ...


def make_executor(
    config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos_token_ids: tuple[int, ...]
) -> Executor:
    """The executor the configuration asks for: the in-process one."""
    from argosy.server.worker.executor import InProcessExecutor

    return InProcessExecutor(config, model, limits, eos_token_ids)
