"""Rendering a checkpoint's chat template in a sandboxed Jinja environment: templates come
with checkpoints, so they must not reach Python objects beyond the messages."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from argosy.server.exceptions import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


def validate_messages(messages: Any) -> list[dict[str, Any]]:
    """Checks a conversation's shape; text parts of list-valued content are joined."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", param="messages")
    result = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or "role" not in message:
            raise InvalidRequestError(f"messages[{i}] must be an object with a 'role'", param=f"messages[{i}]")
        if message["role"] not in ROLES:
            raise InvalidRequestError(
                f"messages[{i}].role {message['role']!r} is not one of {', '.join(ROLES)}", param=f"messages[{i}].role"
            )
        content = message.get("content")
        if isinstance(content, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise InvalidRequestError(
                    f"messages[{i}].content: only text parts with string text are supported",
                    param=f"messages[{i}].content",
                )
            content = "".join(p.get("text", "") for p in content)
        if content is not None and not isinstance(content, str):
            raise InvalidRequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        checked = {**message, "content": content or ""}
        if message["role"] == "assistant" and message.get("tool_calls") is not None:
            checked["tool_calls"] = _tool_calls(message["tool_calls"], f"messages[{i}].tool_calls")
        if message["role"] == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise InvalidRequestError(
                f"messages[{i}] is a tool result: it needs the tool_call_id it answers",
                param=f"messages[{i}].tool_call_id",
            )
        result.append(checked)
    return result


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    """An assistant turn's calls, their arguments as objects (what chat templates expect)."""
    if not isinstance(calls, list):
        raise InvalidRequestError(f"{where} must be a list", param=where)
    checked = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise InvalidRequestError(f"{where}[{j}] must have a function with a name", param=f"{where}[{j}]")
        arguments = function.get("arguments", "{}")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError as exc:
            raise InvalidRequestError(
                f"{where}[{j}].function.arguments is not JSON: {exc}", param=f"{where}[{j}].function.arguments"
            ) from exc
        checked.append({**call, "function": {**function, "arguments": arguments}})
    return checked


def render(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool,
    special_tokens: dict[str, str],
    tools: list[dict[str, Any]] | None = None,
) -> str:
    try:
        return _compile(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, tools=tools, **special_tokens
        )
    except InvalidRequestError:
        raise
    except TemplateError as exc:
        raise InvalidRequestError(f"chat template failed: {exc}", param="messages") from exc


@lru_cache(maxsize=8)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _raise(message: str):
    raise InvalidRequestError(f"chat template rejected the conversation: {message}", param="messages")
