"""LLMEngine: the whole engine in one process, for the offline `LLM`: the input processor
(tokenize, validate), the engine core (schedule, execute, sample) and the output processor
(detokenize, stop strings), which `argosy serve` splits across two processes. `add_request`
queues, `step` runs one iteration and returns what changed, `abort` withdraws a request, and
`take_failed` names the requests that failed alone (no longer in flight) and why. With LoRA on,
a request names its adapter with a LoRARequest, registered by name at first use."""

from __future__ import annotations

import time

from argosy.server.engine.core_protocol import failure_error
from argosy.server.engine.engine_core import EngineCore
from argosy.server.engine.input_processor import InputProcessor, NewRequest
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.request_options import RequestOptions
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import EngineFailedError, InvalidRequestError
from argosy.server.lora.registry import AdapterRegistry
from argosy.server.lora.request import AdapterRef, LoRARequest
from argosy.server.outputs import EngineStats, RequestOutput
from argosy.server.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.core = EngineCore(config)
        self.inputs = InputProcessor.for_model(config)
        self.tokenizer = self.inputs.tokenizer
        self.outputs = OutputProcessor(self.tokenizer)
        self._failed: dict[str, Exception] = {}
        name = config.served_model_name or self.core.model_config.path
        self.adapters = (
            AdapterRegistry(self.core.model_config, config.max_lora_rank, name) if config.enable_lora else None
        )

    @property
    def requests(self) -> dict:
        """The requests in flight, by id."""
        return self.outputs.requests

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        lora_request: LoRARequest | None = None,
        priority: int = 0,
        user: str | None = None,
    ) -> None:
        """Queues a prompt (text, or token ids). Raises InvalidRequestError, with nothing
        allocated, when the request cannot be served. `user`: whose share it counts against
        under the fair policy."""
        options = RequestOptions(self.adapter_for(lora_request), priority, user)
        self.enqueue(self.inputs.make_request(request_id, prompt, params, arrival_time, options=options))

    def adapter_for(self, lora_request: LoRARequest | None) -> AdapterRef | None:
        """The adapter a LoRARequest names, registered at its first use (or when its folder
        changes); what the name stood for before is retired once nothing uses it."""
        if lora_request is None:
            return None
        if self.adapters is None:
            raise InvalidRequestError("a lora_request was given, but LoRA is off (enable_lora=True)", "lora_request")
        ref = self.adapters.get(lora_request.lora_name)
        if ref is None or ref.path != str(lora_request.lora_path):
            ref, old = self.adapters.register(lora_request.lora_name, str(lora_request.lora_path), replace=True)
            self.core.load_adapter(ref)  # served (again, if its weights had been retired)
            if old is not None and old.digest != ref.digest and not self.adapters.is_served(old.digest):
                self.core.retire_adapter(old.digest)
        return ref

    def enqueue(self, request: NewRequest) -> None:
        self.core.add_request(request.core)  # raises first on a request id in use
        self.outputs.add(request)

    def abort(self, request_id: str) -> bool:
        self.core.abort(request_id)
        return self.outputs.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.outputs.requests)

    def step(self) -> list[RequestOutput]:
        results, stopped = self.outputs.process(self.core.step(), time.monotonic())
        self.core.finish_sequences(stopped)
        for failure in self.core.take_failed():
            self.outputs.abort(failure.request_id)
            self._failed[failure.request_id] = failure_error(failure)
        for request_id, message in self.outputs.take_failed().items():
            self.core.abort(request_id)
            self._failed[request_id] = EngineFailedError(message)
        return results

    def take_failed(self) -> dict[str, Exception]:
        """The requests that failed alone since the last call, and why (InvalidRequestError
        when it was the request's fault)."""
        failed, self._failed = self._failed, {}
        return failed

    def stats(self) -> EngineStats:
        return self.core.stats()
