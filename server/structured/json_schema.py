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
# The library's own date and time formats allow 2023-02-30 and a leap second at any minute:
# these exact patterns replace them (whole seconds up to 59: a subset of the valid times, as
# the library mis-compiles an optional fraction, `(\\.[0-9]{1,6})?`, inside a schema's pattern).
_LEAP_YEAR = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)"
_DATE = (
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)"
    f"|02-(0[1-9]|1[0-9]|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMAT_PATTERNS = {"date": f"^{_DATE}$", "time": f"^{_TIME}$", "date-time": f"^{_DATE}T{_TIME}$"}
# Not ipv4 (the library allows leading zeros, "014.1.1.1", which the format forbids) nor
# hostname (it allows labels longer than 63 characters).
FORMATS = frozenset(
    {
        *FORMAT_PATTERNS,
        "duration",
        "email",
        "ipv6",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
        "uuid",
    }
)
# Pairs the library accepts but enforces only one of (it says so, then drops the other).
_EXCLUSIVE = (
    ("format", ("minLength", "maxLength", "pattern")),
    ("pattern", ("minLength", "maxLength")),
    ("multipleOf", ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")),
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
    for first, others in _EXCLUSIVE:
        clash = next((k for k in others if first in node and k in node), None)
        if clash is not None:
            _refuse(param, f"{path}/{clash}", f"{first} and {clash} together cannot be enforced while generating")
    if "multipleOf" in node and node.get("type") != "integer":
        _refuse(param, f"{path}/multipleOf", "multipleOf is enforced on integers only (type: integer)")
    if isinstance(node.get("pattern"), str):
        check_regex(node["pattern"], f"{param}: at {path}/pattern", param)
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


def exact_formats(node: Any) -> Any:
    """A checked schema with the formats of FORMAT_PATTERNS written as their patterns."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if out.get("format") in FORMAT_PATTERNS:
        out["pattern"] = FORMAT_PATTERNS[out.pop("format")]
    for keyword, value in node.items():
        if keyword in _SUBSCHEMA:
            out[keyword] = exact_formats(value)
        elif keyword in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[keyword] = {name: exact_formats(sub) for name, sub in value.items()}
        elif keyword in _SUBSCHEMA_LISTS and isinstance(value, list):
            out[keyword] = [exact_formats(sub) for sub in value]
    return out


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


def check_regex(regex: str, where: str, param: str) -> None:
    """Refuses what the library's regular expressions would drop: lookarounds, and anchors
    anywhere but at the ends."""
    plain = _outside_classes(regex)
    for look in ("(?=", "(?!", "(?<=", "(?<!"):
        if look in plain:
            raise InvalidRequestError(
                f"{where}: lookaround {look}...) cannot be enforced while generating", param=param
            )
    body = plain[1:] if plain.startswith("^") else plain
    body = body[:-1] if body.endswith("$") else body
    if "^" in body or "$" in body:
        raise InvalidRequestError(f"{where}: anchors (^, $) are enforced only at the start and the end", param=param)


def _outside_classes(regex: str) -> str:
    """The regex without escaped characters and character classes (each becomes a dot)."""
    out, i, in_class = [], 0, False
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            i += 2
            out.append(".")
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(".")
            if regex[i + 1 : i + 2] == "]":  # a leading ] is a member, not the end
                i += 1
        else:
            out.append(c)
        i += 1
    return "".join(out)
