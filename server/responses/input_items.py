"""A Responses request's `input` (a string, or typed items) as the chat messages the chat
template renders: messages, function calls (consecutive ones in one assistant
message, as chat templates expect them) and their outputs. Each refusal names the item."""

from __future__ import annotations

from typing import Any

from argosy.server.exceptions import InvalidRequestError

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
IGNORED = ("reasoning",)  # a model without reasoning has none to carry on


def chat_messages(items: str | list[Any]) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise InvalidRequestError("input must not be empty", param="input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequestError(f"{where} must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {"name": _string(item, "name", where), "arguments": _string(item, "arguments", where)},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and last.get("tool_calls"):
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text})
        elif kind not in IGNORED:
            raise InvalidRequestError(
                f"{where}.type {kind!r} is not supported (message, function_call, function_call_output)",
                param=f"{where}.type",
            )
    return messages


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if not isinstance(role, str) or role not in ROLES:
        raise InvalidRequestError(
            f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role"
        )
    content = item.get("content")
    text = content if isinstance(content, str) else _text(content, f"{where}.content")
    return {"role": ROLES[role], "content": text}


def _text(parts: Any, where: str) -> str:
    """The text of a list of content parts: text parts only (this server reads no images or files)."""
    if not isinstance(parts, list):
        raise InvalidRequestError(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind != "refusal":
            raise InvalidRequestError(
                f"{where}[{j}] must be an input_text or output_text part, got {kind!r}", param=f"{where}[{j}]"
            )
    return "".join(texts)


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise InvalidRequestError(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value
