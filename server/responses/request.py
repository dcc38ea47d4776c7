"""POST /v1/responses' body, read into the chat request that serves it: the same prompt rendering,
tool calling, constraints and sampling as /v1/chat/completions. Function tools and `text.format`
arrive flat and are nested as chat has them; a chat field's error is renamed to the Responses
field the client sent."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from argosy.server.api.protocol import ChatCompletionRequest, StreamOptions
from argosy.server.exceptions import InvalidRequestError
from argosy.server.responses.input_items import chat_messages

METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512  # OpenAI's limits
# A chat field's error, as the Responses field it came from.
RENAMED = [
    (re.compile(r"^messages"), "input"),
    (re.compile(r"^max_tokens$"), "max_output_tokens"),
    (re.compile(r"^response_format(\.json_schema)?"), "text.format"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
]


class ResponsesRequest(BaseModel):
    """Fields it does not know are ignored, as OpenAI's are."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None  # accepted and ignored: this server's models do not reason
    background: bool | None = None
    stream: bool | None = None
    user: str | None = None
    truncation: str | None = None
    priority: int = 0  # vLLM's

    def check(self) -> None:
        if self.background:
            raise InvalidRequestError("background responses are not supported", param="background")
        if self.truncation not in (None, "disabled"):
            raise InvalidRequestError("truncation must be 'disabled' (or left out)", param="truncation")
        metadata = self.metadata or {}
        if len(metadata) > METADATA_KEYS:
            raise InvalidRequestError(f"metadata holds at most {METADATA_KEYS} keys", param="metadata")
        for key, value in metadata.items():
            if len(key) > METADATA_KEY_CHARS or len(value) > METADATA_VALUE_CHARS:
                raise InvalidRequestError(
                    f"metadata keys are at most {METADATA_KEY_CHARS} characters and values {METADATA_VALUE_CHARS}",
                    param="metadata",
                )

    def conversation(self, history: list[dict]) -> list[dict]:
        """This turn's messages after `history`, the earlier turns' (without their instructions,
        as OpenAI carries a conversation on)."""
        self.check()
        return history + chat_messages(self.input)

    def chat_request(self, conversation: list[dict]) -> ChatCompletionRequest:
        """The chat call of this turn: its instructions, then the conversation."""
        system = [] if self.instructions is None else [{"role": "system", "content": self.instructions}]
        return ChatCompletionRequest(
            model=self.model,
            messages=system + conversation,
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stream=self.stream,
            stream_options=StreamOptions(include_usage=True) if self.stream else None,
            user=self.user,
            priority=self.priority,
            tools=None if self.tools is None else [_chat_tool(tool, i) for i, tool in enumerate(self.tools)],
            tool_choice=_chat_tool_choice(self.tool_choice),
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=_response_format(self.text),
        )


def renamed(exc: InvalidRequestError) -> InvalidRequestError:
    """A chat field's error with the Responses field's name."""
    for pattern, name in RENAMED:
        if exc.param is not None and pattern.search(exc.param):
            exc.param = pattern.sub(name, exc.param, count=1)
            break
    return exc


def _chat_tool(tool: Any, i: int) -> Any:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise InvalidRequestError(f"tools[{i}].type must be 'function', got {kind!r}", param=f"tools[{i}].type")
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    spec = None if text is None else text.get("format")
    if spec is not None and not isinstance(spec, dict):
        raise InvalidRequestError("text.format must be an object", param="text.format")
    if spec is None or spec.get("type") != "json_schema":
        return spec
    return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if k != "type"}}
