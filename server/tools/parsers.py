"""Tool-call parsers: from a model's output text (whole, or the part generated so far) to its
content and its calls, in each model family's format. `parse(text, final)` only ever extends
what it said of a shorter text: content and each call's arguments grow at their end, and a call
appears once its name is complete. So streaming is the difference of successive parses, and the
streamed calls add up to exactly the whole parse.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen2.5, Qwen3,
  Hermes), and a block may hold a list of calls, as SmolLM2 writes them (`smollm2`).
- `llama3_json`: an output that is one or more `{"name": ..., "parameters": {...}}` objects,
  separated by `;`, after an optional `<|python_tag|>` (Llama 3.1 and later).
- `json_array` and `named`: what the grammars of `tool_choice` required and a named function
  produce (tool_grammars.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from argosy.server.tools.partial_json import array_items, object_members, skip_space

ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass
class Call:
    name: str
    arguments: str  # the JSON text of the arguments, as written (so far)


@dataclass
class Parsed:
    content: str
    calls: list[Call] = field(default_factory=list)


class ToolParser(Protocol):
    def parse(self, text: str, final: bool) -> Parsed:
        """The content and calls of `text`; `final`: nothing more will come."""
        ...


def read_call(text: str, start: int, final: bool) -> tuple[Call | None, int | None]:
    """The call written as the object at `start` (None until its name is complete), and the
    index past the object (None while open)."""
    members, end = object_members(text, start)
    by_key = {m.key: m for m in members}
    name = by_key.get("name")
    if name is None or name.end is None or text[name.start] != '"':
        return None, end
    arguments = next((by_key[k] for k in ARGUMENT_KEYS if k in by_key), None)
    written = "" if arguments is None else text[arguments.start : arguments.end or len(text)]
    if final and not written:
        written = "{}"
    return Call(text[name.start + 1 : name.end - 1], written), end


def read_calls(text: str, start: int, final: bool) -> tuple[list[Call], int | None]:
    """The calls of one object or a list of them at `start`, and the index past it."""
    start = skip_space(text, start)
    if start >= len(text):
        return [], None
    if text[start] == "{":
        call, end = read_call(text, start, final)
        return [call] if call else [], end
    if text[start] != "[":
        return [], None
    items, end = array_items(text, start)
    calls = [c for s, _ in items if text[s] == "{" and (c := read_call(text, s, final)[0]) is not None]
    return calls, end


def content(parts: list[str]) -> str:
    """Text that is not a call, stripped: trailing whitespace waits until more text follows it."""
    return "".join(parts).strip()


class HermesParser:
    """Blocks between tags; a block holds one call object or a list of them."""

    def __init__(self, start_tag: str = "<tool_call>", end_tag: str = "</tool_call>"):
        self.start_tag, self.end_tag = start_tag, end_tag

    def parse(self, text: str, final: bool) -> Parsed:
        outside, calls, i = [], [], 0
        while True:
            opened = text.find(self.start_tag, i)
            if opened < 0:
                tail = text[i:]
                outside.append(tail if final else tail[: len(tail) - _partial_tag(tail, self.start_tag)])
                return Parsed(content(outside), calls)
            outside.append(text[i:opened])
            body = opened + len(self.start_tag)
            found, end = read_calls(text, body, final)
            calls += found
            closed = text.find(self.end_tag, end if end is not None else body)
            if end is None or closed < 0:
                return Parsed(content(outside), calls)
            i = closed + len(self.end_tag)


class Llama3JsonParser:
    """An output that starts with a JSON object is calls, one object after another (`;` between
    them); any other output is content."""

    PYTHON_TAG = "<|python_tag|>"

    def parse(self, text: str, final: bool) -> Parsed:
        i = skip_space(text, 0)
        if not final and self.PYTHON_TAG.startswith(text[i:]):
            return Parsed("")  # nothing yet says whether it is calls
        if text.startswith(self.PYTHON_TAG, i):
            i = skip_space(text, i + len(self.PYTHON_TAG))
        if i >= len(text) or text[i] != "{":
            return Parsed(content([text]))
        calls = []
        while i < len(text) and text[i] == "{":
            call, end = read_call(text, i, final)
            calls += [call] if call else []
            if end is None:
                break
            i = skip_space(text, end)
            if text.startswith(";", i):
                i = skip_space(text, i + 1)
        return Parsed("", calls)


class JsonArrayParser:
    """The whole output is a list of call objects (`tool_choice` required)."""

    def parse(self, text: str, final: bool) -> Parsed:
        return Parsed("", read_calls(text, 0, final)[0])


class NamedParser:
    """The whole output is the arguments of the one function named (`tool_choice` a function)."""

    def __init__(self, name: str):
        self.name = name

    def parse(self, text: str, final: bool) -> Parsed:
        return Parsed("", [Call(self.name, text)])


PARSERS = {"hermes": HermesParser, "smollm2": HermesParser, "llama3_json": Llama3JsonParser}


def _partial_tag(text: str, tag: str) -> int:
    """How many characters at the end of `text` could begin `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
