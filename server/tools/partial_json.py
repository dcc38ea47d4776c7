"""Reading JSON that is still being generated: where a value ends (if it has), and the members of
an object or the items of an array so far, each as a span of the text. Spans, not parsed values,
so that a call's arguments stream as the very characters the model wrote."""

from __future__ import annotations

import json
from dataclasses import dataclass

WHITESPACE = " \t\r\n"


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in WHITESPACE:
        i += 1
    return i


def value_end(text: str, start: int) -> int | None:
    """The index just past the JSON value starting at `start`; None while it is unfinished. A
    scalar (a number, true) ends only where something follows it."""
    depth, in_string, escaped = 0, False, False
    first = text[start] if start < len(text) else ""
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:  # a scalar ended by its container's close
                return i
        elif depth == 0 and first not in '{["' and (c in ",:" or c in WHITESPACE):
            return i
    return None


@dataclass
class Member:
    key: str
    start: int  # of the value
    end: int | None  # past the value; None while unfinished


def object_members(text: str, start: int) -> tuple[list[Member], int | None]:
    """The members of the object whose `{` is at `start` whose keys are complete, and the index
    past its `}` (None while open). Text that is no JSON object ends the reading."""
    members: list[Member] = []
    i = skip_space(text, start + 1)
    while i < len(text):
        if text[i] == "}":
            return members, i + 1
        if text[i] == ",":
            i = skip_space(text, i + 1)
            continue
        key_end = value_end(text, i) if text[i] == '"' else None
        if key_end is None:
            return members, None
        colon = skip_space(text, key_end)
        if colon >= len(text) or text[colon] != ":":
            return members, None
        value_start = skip_space(text, colon + 1)
        if value_start >= len(text):
            return members, None
        end = value_end(text, value_start)
        members.append(Member(_string(text[i:key_end]), value_start, end))
        if end is None:
            return members, None
        i = skip_space(text, end)
    return members, None


def array_items(text: str, start: int) -> tuple[list[tuple[int, int | None]], int | None]:
    """(start, end) of the items of the array whose `[` is at `start`, and the index past its
    `]` (None while open)."""
    items: list[tuple[int, int | None]] = []
    i = skip_space(text, start + 1)
    while i < len(text):
        if text[i] == "]":
            return items, i + 1
        if text[i] == ",":
            i = skip_space(text, i + 1)
            continue
        end = value_end(text, i)
        if end == i:  # no value starts with this character (":", "}"): nothing more can be read
            return items, None
        items.append((i, end))
        if end is None:
            return items, None
        i = skip_space(text, end)
    return items, None


def _string(literal: str) -> str:
    try:
        value = json.loads(literal)
    except ValueError:
        return ""
    return value if isinstance(value, str) else ""
