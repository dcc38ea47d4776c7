"""Request bodies of the OpenAI API (plus vLLM's extra sampling fields), as pydantic
models that turn themselves into SamplingParams. Unknown fields are ignored, as OpenAI does."""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from argosy.server.api.structured_fields import read_constraints
from argosy.server.exceptions import InvalidRequestError
from argosy.server.sampling_params import SamplingParams
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.tools.request import ToolUse, read_tools
from argosy.server.tools.tool_grammars import tool_constraint


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both endpoints share. Strict types, as JSON has them: `true` is no number, `1` no
    boolean, `"2"` neither (an integer still counts as a float)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    # OpenAI accepts null for every optional field: None means the default.
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None  # whose share the request counts against, with --scheduling-policy fair
    priority: int = 0  # vLLM's: lower runs first, with --scheduling-policy priority (else only 0)
    # vLLM's extra sampling fields
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    include_stop_str_in_output: bool | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI's: token ids (as JSON keys) to a bias in [-100, 100]
    # Constraints (structured_fields.py reads them): OpenAI's, vLLM's, and vLLM's older ones.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None
    # vLLM's prefill/decode hand-off, as its router's P/D mode sends it (read by KVTransferParams)
    kv_transfer_params: dict[str, Any] | None = None

    def sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        if self.stream_options is not None and not self.streaming:
            raise InvalidRequestError("stream_options is only allowed when stream is true", param="stream_options")
        given = self.model_dump(include=SAMPLING_FIELDS, exclude_none=True)  # None: SamplingParams' default
        return SamplingParams(
            max_tokens=max_tokens,
            logprobs=logprobs,
            structured_outputs=self.constraint(),
            logit_bias=self.token_biases(),
            **given,
        )

    def token_biases(self) -> dict[int, float] | None:
        """logit_bias with its keys read as token ids (JSON keys are strings)."""
        if not self.logit_bias:
            return None
        biases = {}
        for key, bias in self.logit_bias.items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10):
                raise InvalidRequestError(f"logit_bias keys must be token ids, got {key[:32]!r}", param="logit_bias")
            biases[int(key)] = bias
        return biases

    def constraint(self) -> StructuredOutputsParams | None:
        return read_constraints(self)

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


# The request fields that are SamplingParams fields of the same name (max_tokens and logprobs
# differ between the endpoints and are passed on by each).
SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)} & set(SamplingFields.model_fields) - {
    "structured_outputs",
    "logit_bias",
}


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = Field(default=None, ge=0)  # at most the server's max_logprobs
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None

    def prompts(self) -> list[str | list[int]]:
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts: list[Any] = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        if not prompts:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        return prompts

    def to_sampling_params(self) -> SamplingParams:
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise InvalidRequestError("best_of is not supported (it must equal n)", param="best_of")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported", param="suffix")
        if self.echo and self.logprobs is not None:
            raise InvalidRequestError("echo with logprobs (prompt logprobs) is not supported", param="echo")
        return self.sampling_params(self.max_tokens, self.logprobs)


class ChatCompletionRequest(SamplingFields):
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    tools: Any = None  # checked by read_tools, which names the field at fault
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None

    @cached_property
    def tool_use(self) -> ToolUse | None:  # read once: the constraint and the handler both need it
        return read_tools(self.tools, self.tool_choice, self.parallel_tool_calls)

    def constraint(self) -> StructuredOutputsParams | None:
        """A schema asked for, or the grammar of the calls tool_choice requires: one at most."""
        asked = read_constraints(self)
        tools = self.tool_use
        required = None if tools is None else tool_constraint(tools)
        if asked is not None and required is not None:
            raise InvalidRequestError(
                f"a request takes one constraint; got {asked.field} and tool_choice {tools.mode}", param="tool_choice"
            )
        return asked or required

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        given = self.max_completion_tokens is not None
        try:
            return self.sampling_params(
                self.max_completion_tokens if given else self.max_tokens,
                (self.top_logprobs or 0) if self.logprobs else None,
            )
        except InvalidRequestError as exc:  # name the field the client actually sent
            if given and exc.param == "max_tokens":
                exc.param = "max_completion_tokens"
            elif exc.param == "logprobs":
                exc.param = "top_logprobs"
            raise
