"""A streamed choice's tool calls: each delta of text is parsed with what came before, and only
what the parse added is sent: new content, and for each call its index, id and name once, then
fragments of its arguments. Whole or streamed, a choice's calls are the same."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from argosy.server.tools.parsers import Call, Parsed, ToolParser


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call_body(call: Call, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


@dataclass
class ToolStream:
    parser: ToolParser
    text: str = ""
    content_sent: int = 0
    calls_sent: list[tuple[str, int]] = field(default_factory=list)  # (id, argument characters sent)

    def feed(self, text: str, final: bool) -> tuple[str, list[dict], Parsed]:
        """The new content and the tool-call deltas after `text`, and the parse so far."""
        self.text += text
        parsed = self.parser.parse(self.text, final)
        content, self.content_sent = parsed.content[self.content_sent :], len(parsed.content)
        deltas = []
        for index, call in enumerate(parsed.calls):
            if index == len(self.calls_sent):
                call_id = new_call_id()
                self.calls_sent.append((call_id, 0))
                deltas.append({"index": index, **call_body(call, call_id)})
            else:
                call_id, sent = self.calls_sent[index]
                if len(call.arguments) > sent:
                    deltas.append({"index": index, "function": {"arguments": call.arguments[sent:]}})
            self.calls_sent[index] = (call_id, len(call.arguments))
        return content, deltas, parsed
