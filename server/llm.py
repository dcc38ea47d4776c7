"""LLM: the offline API. Queue every prompt, step the engine until all are done, return the
outputs in prompt order."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from argosy.server.engine.llm_engine import LLMEngine
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import EngineFailedError, InvalidRequestError
from argosy.server.lora.request import LoRARequest
from argosy.server.outputs import EngineStats, RequestOutput
from argosy.server.sampling_params import RequestOutputKind, SamplingParams
from argosy.server.tools.chat_format import ChatFormat
from argosy.server.tools.request import read_tools

PromptInput = str | dict[str, Any]
Conversation = list[dict[str, Any]]


class LLM:
    """The engine in this process. Keyword arguments are EngineConfig's settings (the engine
    flags of `argosy serve`, snake_case), with the same defaults."""

    def __init__(self, model: str | None = None, **kwargs: Any):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))
        self._next_id = 0

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: PromptInput | list[PromptInput],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        lora_request: LoRARequest | list[LoRARequest | None] | None = None,
        priority: list[int] | None = None,
    ) -> list[RequestOutput]:
        """`lora_request`: the adapter of every prompt, or one per prompt (None: the base model);
        `priority`: one per prompt, lower first (with scheduling_policy="priority")."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        params = _per_prompt(sampling_params or SamplingParams(), prompts, "sampling_params", "SamplingParams")
        loras = _per_prompt(lora_request, prompts, "lora_request", "LoRARequests")
        priorities = _per_prompt(priority or 0, prompts, "priority", "priorities")
        return self._run([_prompt_of(p) for p in prompts], params, loras, priorities)

    def chat(
        self,
        messages: Conversation | list[Conversation],
        sampling_params: SamplingParams | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        lora_request: LoRARequest | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[RequestOutput]:
        """`tools` (OpenAI's shape) are shown to the model by the chat template, as the server
        shows them; the outputs are its text, calls unparsed."""
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        tokenizer = self.engine.tokenizer
        chat = ChatFormat.for_model(chat_template, None, tokenizer)
        tool_use = read_tools(tools, None, None)
        prompts = [
            tokenizer.encode(chat.prompt(tokenizer, c, add_generation_prompt, tool_use), add_special_tokens=False)
            for c in conversations
        ]
        return self._run(prompts, [sampling_params or SamplingParams()] * len(prompts), [lora_request] * len(prompts))

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def update_weights(self, model_path: str) -> None:
        """Serves the checkpoint at `model_path` from now on (same tensors as the running one:
        names, shapes, dtypes), swapped in place; raises CheckpointError, changing nothing,
        when it does not match."""
        self.engine.core.update_weights(model_path)

    def sleep(self, level: int = 1) -> int:
        """Frees the KV cache (level 1) and the weights too (level 2), as vLLM's sleep mode;
        returns the bytes freed. Generating needs wake_up first."""
        return self.engine.core.sleep(level)

    def wake_up(self) -> None:
        self.engine.core.wake_up()

    def reset_prefix_cache(self) -> bool:
        """Forgets every cached prompt block, as vLLM's; False while requests are in flight."""
        return self.engine.core.reset_prefix_cache()

    def _run(
        self,
        prompts: list[str | list[int]],
        params: list[SamplingParams],
        loras: list[LoRARequest | None],
        priorities: list[int] | None = None,
    ) -> list[RequestOutput]:
        ids = []
        try:
            for prompt, p, lora, priority in zip(prompts, params, loras, priorities or [0] * len(prompts)):
                ids.append(str(self._next_id))
                self._next_id += 1
                # Only the finished outputs are returned: no output is built before then.
                final = replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                self.engine.add_request(ids[-1], prompt, final, lora_request=lora, priority=priority)
        except Exception:
            for request_id in ids:  # an invalid prompt leaves nothing of the batch behind
                self.engine.abort(request_id)
            raise
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(ids):
            for output in self.engine.step():
                if output.finished:
                    finished[output.request_id] = output
            if failed := self.engine.take_failed():
                for request_id in ids:  # the batch cannot be answered whole: nothing of it stays
                    self.engine.abort(request_id)
                request_id, error = next(iter(failed.items()))
                if isinstance(error, InvalidRequestError):
                    raise InvalidRequestError(f"prompt {ids.index(request_id)}: {error}", param=error.param)
                raise EngineFailedError(f"prompt {ids.index(request_id)} failed: {error}")
        return [finished[i] for i in ids]


def _prompt_of(prompt: PromptInput) -> str | list[int]:
    if isinstance(prompt, str):
        return prompt
    if "prompt_token_ids" in prompt:
        return list(prompt["prompt_token_ids"])
    if "prompt" in prompt:
        return prompt["prompt"]
    raise InvalidRequestError("a prompt dict needs 'prompt' or 'prompt_token_ids'", param="prompt")


def _per_prompt(value: Any, prompts: list, param: str, what: str) -> list:
    """One value for every prompt, or a list of one each."""
    if not isinstance(value, list):
        return [value] * len(prompts)
    if len(value) != len(prompts):
        raise InvalidRequestError(f"got {len(value)} {what} for {len(prompts)} prompts", param=param)
    return value
