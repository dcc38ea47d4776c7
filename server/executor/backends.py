"""make_executor: the executor an EngineConfig asks for (distributed_executor_backend): `mp` in
multiproc.py, `uni` in in_process.py, each imported only when chosen."""

from __future__ import annotations

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.executor.executor import Executor
from argosy.server.models.model_config import ModelConfig


def make_executor(
    config: EngineConfig, model: ModelConfig, limits: EngineLimits, eos_token_ids: tuple[int, ...]
) -> Executor:
    """The executor the configuration asks for (distributed_executor_backend)."""
    if config.executor_backend == "mp":
        from argosy.server.executor.multiproc import MultiprocExecutor

        return MultiprocExecutor(config, model, limits, eos_token_ids)
    from argosy.server.executor.in_process import InProcessExecutor

    return InProcessExecutor(config, model, limits, eos_token_ids)
