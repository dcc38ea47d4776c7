"""The constraints that `tool_choice` required and a named function put on the output: valid
calls of the given functions, each with arguments that match its parameters' schema."""

from __future__ import annotations

from typing import Any

from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.tools.request import Function, ToolUse


def tool_constraint(tools: ToolUse) -> StructuredOutputsParams | None:
    """None for auto and none: the model decides, and the parser reads what it wrote."""
    if tools.mode == "function":
        function = tools.named
        index = tools.functions.index(function)
        return StructuredOutputsParams(json=function.parameters, field=f"tools[{index}].function.parameters")
    if tools.mode != "required":
        return None
    defs: dict[str, Any] = {}
    calls = [_call_schema(f, defs) for f in tools.functions]
    schema: dict[str, Any] = {"type": "array", "items": {"anyOf": calls}, "minItems": 1}
    if not tools.parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return StructuredOutputsParams(json=schema, field="tools")


def _call_schema(function: Function, defs: dict[str, Any]) -> dict:
    """One call of `function`; the definitions its parameters refer to move to the root, under
    names of their own, since references resolve from there."""
    parameters = dict(function.parameters)
    prefix = f"{function.name}."
    for key in ("$defs", "definitions"):
        for name, sub in parameters.pop(key, {}).items():
            defs[prefix + name] = sub
    parameters = _rewrite_refs(parameters, prefix)
    for name in [n for n in defs if n.startswith(prefix)]:
        defs[name] = _rewrite_refs(defs[name], prefix)
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "parameters": parameters},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def _rewrite_refs(node: Any, prefix: str) -> Any:
    if isinstance(node, list):
        return [_rewrite_refs(item, prefix) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _rewrite_refs(v, prefix) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str):
        for local in ("#/$defs/", "#/definitions/"):
            if ref.startswith(local):
                out["$ref"] = "#/$defs/" + prefix + ref[len(local) :]
    return out
