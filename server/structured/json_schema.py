"""Which JSON-schema keywords a constrained output honours. A keyword the grammar library does
not enforce is refused (400, naming it and where it is), never silently dropped: the lists
below were found by compiling each keyword and checking that an instance breaking it cannot be
generated (tests/server/structured/test_json_schema.py does so for every entry)."""

from __future__ import annotations

from typing import Any

from argosy.server.exceptions import InvalidRequestError

ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "unevaluatedProperties",
        "patternProperties",
        "minProperties",
        "maxProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",  # when its branches cannot overlap (see _disjoint): then it is anyOf
        "allOf",  # of one subschema
        "$ref",  # within the schema
        "$defs",
        "definitions",
        "pattern",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "format",  # of FORMATS
        "nullable",  # OpenAPI's
    }
)
# Words that describe and constrain nothing.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",  # OpenAPI's note on a oneOf, whose branches are checked themselves
    }
)
FORMATS = frozenset(
    {
        "date",
        "time",
        "date-time",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "uuid",
    }
)
_SUBSCHEMA = ("additionalProperties", "unevaluatedProperties", "items")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf", "allOf")


def check_schema(schema: Any, param: str) -> None:
    """Raises InvalidRequestError naming `param` and the path of the first keyword that cannot
    be enforced (or of a value that is no schema)."""
    _check(schema, schema, "", param)


def _check(node: Any, root: Any, path: str, param: str) -> None:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        _refuse(param, path, "a schema must be an object or a boolean")
    for keyword, value in node.items():
        where = f"{path}/{keyword}"
        if keyword in ANNOTATIONS or keyword.startswith("x-"):
            continue
        if keyword not in ENFORCED:
            _refuse(param, where, f"the keyword {keyword!r} cannot be enforced while generating")
        if keyword == "format" and value not in FORMATS:
            _refuse(param, where, f"format {value!r} cannot be enforced (supported: {', '.join(sorted(FORMATS))})")
        if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
            _refuse(param, where, f"$ref {value!r}: only references within the schema (#/...) are followed")
        if keyword == "allOf" and not (isinstance(value, list) and len(value) == 1):
            _refuse(param, where, "allOf of more than one schema cannot be enforced while generating")
        if keyword == "oneOf" and isinstance(value, list) and not _disjoint(value, root):
            _refuse(param, where, "oneOf whose branches may overlap cannot be enforced (use anyOf, or const tags)")
        if keyword in _SUBSCHEMA and isinstance(value, (dict, bool)):
            _check(value, root, where, param)
        elif keyword in _SUBSCHEMA_MAPS:
            if not isinstance(value, dict):
                _refuse(param, where, f"{keyword} must be an object")
            for name, sub in value.items():
                _check(sub, root, f"{where}/{name}", param)
        elif keyword in _SUBSCHEMA_LISTS:
            if not isinstance(value, list) or not value:
                _refuse(param, where, f"{keyword} must be a non-empty array")
            for i, sub in enumerate(value):
                _check(sub, root, f"{where}/{i}", param)


def _refuse(param: str, path: str, why: str) -> None:
    raise InvalidRequestError(f"{param}: at {path or '/'}: {why}", param=param)


def _disjoint(branches: list, root: Any) -> bool:
    """Whether no instance can match two branches: they differ in type, or in the const of a
    property both require (a tagged union, as pydantic writes them)."""
    resolved = [_resolve(b, root) for b in branches]
    return all(_apart(a, b) for i, a in enumerate(resolved) for b in resolved[i + 1 :])


def _apart(a: Any, b: Any) -> bool:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    types_a, types_b = _types(a), _types(b)
    if not types_a & types_b:
        return True
    tags_a, tags_b = _tags(a), _tags(b)
    return any(tags_a[name] != tags_b[name] for name in tags_a.keys() & tags_b.keys())


def _types(schema: dict) -> set[str]:
    declared = schema.get("type")
    if declared is None:
        return {"object", "array", "string", "number", "boolean", "null"}
    types = {declared} if isinstance(declared, str) else set(declared)
    return {"number" if t == "integer" else t for t in types}  # an integer is a number


def _tags(schema: dict) -> dict[str, Any]:
    """Required properties with one allowed value, by name."""
    tags = {}
    for name in schema.get("required", []):
        prop = schema.get("properties", {}).get(name)
        if isinstance(prop, dict) and "const" in prop:
            tags[name] = repr(prop["const"])
        elif isinstance(prop, dict) and isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
            tags[name] = repr(prop["enum"][0])
    return tags


def _resolve(schema: Any, root: Any) -> Any:
    """A local $ref's target (one level), else the schema itself."""
    ref = schema.get("$ref") if isinstance(schema, dict) else None
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return schema
    node = root
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            return schema
        node = node[part]
    return node
