"""A chat request's tools, read and checked: `tools`, `tool_choice` and `parallel_tool_calls`
as OpenAI defines them. Each problem is a 400 naming its field."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.json_schema import check_schema

NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
MODES = ("none", "auto", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class Function:
    name: str
    description: str | None
    parameters: dict  # a JSON schema of the arguments object


@dataclass(frozen=True)
class ToolUse:
    functions: tuple[Function, ...]
    mode: str  # none, auto, required, or function (the one named must be called)
    parallel: bool  # more than one call allowed
    name: str | None = None  # of the function, with mode function

    @property
    def named(self) -> Function | None:
        return next((f for f in self.functions if f.name == self.name), None)

    def template_tools(self) -> list[dict]:
        """The tools as chat templates read them (OpenAI's shape)."""
        tools = []
        for f in self.functions:
            function = {"name": f.name, "parameters": f.parameters}
            if f.description is not None:
                function["description"] = f.description
            tools.append({"type": "function", "function": function})
        return tools


def read_tools(tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> ToolUse | None:
    if tools is None:
        if tool_choice not in (None, "none"):
            raise InvalidRequestError("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list) or not tools:
        raise InvalidRequestError("tools must be a non-empty list (leave it out for no tools)", param="tools")
    functions = tuple(_function(tool, i) for i, tool in enumerate(tools))
    names: set[str] = set()
    for f in functions:
        if f.name in names:
            raise InvalidRequestError(f"tools name the function {f.name!r} twice", param="tools")
        names.add(f.name)
    if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
        raise InvalidRequestError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    mode, name = _choice(tool_choice, names)
    return ToolUse(functions, mode, parallel_tool_calls is not False, name)


def _function(tool: Any, i: int) -> Function:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise InvalidRequestError(f"{where} must be {{'type': 'function', 'function': {{...}}}}", param=where)
    spec = tool["function"]
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise InvalidRequestError(
            f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {name!r}",
            param=f"{where}.function.name",
        )
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequestError(
            f"{where}.function.description must be a string", param=f"{where}.function.description"
        )
    parameters = spec.get("parameters", EMPTY_PARAMETERS)
    param = f"{where}.function.parameters"
    if not isinstance(parameters, dict):
        raise InvalidRequestError(f"{param} must be a JSON schema object", param=param)
    check_schema(parameters, param)
    return Function(name, description, parameters)


def _choice(choice: Any, names: set[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in MODES:
            raise InvalidRequestError(f"tool_choice must be one of {', '.join(MODES)} or a function", "tool_choice")
        return choice, None
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise InvalidRequestError(
            "tool_choice must be none, auto, required or {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    if name not in names:
        raise InvalidRequestError(f"tool_choice names {name!r}, which is not in tools", param="tool_choice")
    return "function", name
