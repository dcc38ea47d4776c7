"""A response's output as the Responses API types it: a message item with its output_text, then
one function_call item per call; the Response object around them (its required fields always
there, the request's settings echoed); and the same output as chat messages, which carry the
conversation on."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from argosy.server.responses.request import ResponsesRequest
from argosy.server.tools.parsers import Call


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class OutputItems:
    """The items of one response, in order, as they are made (streamed or whole)."""

    items: list[dict] = field(default_factory=list)

    def message(self, text: str = "", status: str = "in_progress") -> dict:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": status, "content": [part]}
        self.items.append(item)
        return item

    def call(self, call: Call, call_id: str, status: str = "in_progress") -> dict:
        item = {"id": new_id("fc"), "type": "function_call", "status": status, "call_id": call_id}
        item |= {"name": call.name, "arguments": call.arguments}
        self.items.append(item)
        return item

    def chat_message(self) -> dict:
        """The output as one assistant message of a chat conversation."""
        text = "".join(i["content"][0]["text"] for i in self.items if i["type"] == "message")
        calls = [
            {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
            for i in self.items
            if i["type"] == "function_call"
        ]
        return {"role": "assistant", "content": text or None, **({"tool_calls": calls} if calls else {})}


def usage(chat_usage: dict) -> dict:
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {
            "cached_tokens": chat_usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": 0,
        },
        "output_tokens": chat_usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat_usage["total_tokens"],
    }


def response_object(
    request: ResponsesRequest,
    response_id: str,
    created: int,
    status: str,
    output: list[dict],
    usage: dict | None,
    stored: bool,
) -> dict:
    tool_choice = request.tool_choice if request.tool_choice is not None else "auto"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning,
        "store": stored,
        "temperature": request.temperature,
        "text": request.text or {"format": {"type": "text"}},
        "tool_choice": tool_choice,
        "tools": request.tools or [],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": usage,
        "user": request.user,
        "metadata": request.metadata or {},
    }
