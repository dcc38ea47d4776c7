"""JSON schemas of the kinds applications send (nested objects, bounded arrays, enums, anyOf,
$defs/$ref, patterns, numeric bounds, formats, required and optional fields). Every one is
bounded, so that even a random model's sampled output ends: the grammar, not the model, is
what the tests hold to account."""

from __future__ import annotations

NAME = {"type": "string", "minLength": 1, "maxLength": 12}
AGE = {"type": "integer", "minimum": 0, "maximum": 130}
SCORE = {"type": "number", "minimum": -1, "maximum": 1}
TAGS = {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 3}
COLOR = {"enum": ["red", "green", "blue"]}
CODE = {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}
DATE = {"type": "string", "format": "date"}
UUID = {"type": "string", "format": "uuid"}
FLAG = {"type": "boolean"}
NULLABLE_AGE = {"anyOf": [AGE, {"type": "null"}]}


def obj(required: dict, optional: dict | None = None, **extra) -> dict:
    return {
        "type": "object",
        "properties": {**required, **(optional or {})},
        "required": list(required),
        "additionalProperties": False,
        **extra,
    }


def array_of(items: dict, low: int = 0, high: int = 3) -> dict:
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}


HAND_WRITTEN = [
    obj({"name": NAME, "age": AGE}),
    obj({"name": NAME}, {"age": AGE, "id": UUID}),
    obj({"color": COLOR, "flag": FLAG}),
    obj({"code": CODE}),
    obj({"when": DATE, "id": UUID}),
    obj({"score": SCORE, "tags": TAGS}),
    obj({"owner": obj({"name": NAME, "age": AGE})}),
    obj({"a": obj({"b": obj({"c": obj({"d": FLAG})})})}),
    obj({"people": array_of(obj({"name": NAME, "age": AGE}), 1, 2)}),
    obj({"matrix": array_of(array_of({"type": "integer", "minimum": 0, "maximum": 9}, 1, 3), 1, 3)}),
    obj({"maybe": NULLABLE_AGE}),
    obj({"v": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "integer", "minimum": 0, "maximum": 99}]}}),
    obj({"status": {"const": "ok"}, "count": AGE}),
    obj({"pair": {"type": "array", "prefixItems": [NAME, AGE], "items": False}}),
    {"$defs": {"person": obj({"name": NAME, "age": AGE})}, **obj({"who": {"$ref": "#/$defs/person"}})},
    {
        "$defs": {"node": obj({"label": NAME}, {"children": array_of({"$ref": "#/$defs/node"}, 0, 2)})},
        "$ref": "#/$defs/node",
    },
    {"definitions": {"c": COLOR}, **obj({"fg": {"$ref": "#/definitions/c"}, "bg": {"$ref": "#/definitions/c"}})},
    obj(
        {
            "shape": {
                "oneOf": [
                    obj({"kind": {"const": "circle"}, "r": SCORE}),
                    obj({"kind": {"const": "square"}, "side": SCORE}),
                ]
            }
        }
    ),
    obj({"level": {"type": "integer", "minimum": 1, "maximum": 5, "description": "a rating"}}, title="Review"),
    obj({"price": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000}}),
    obj({"hour": {"type": "integer", "minimum": 0, "maximum": 23}, "minute": {"enum": [0, 15, 30, 45]}}),
    obj({"word": {"type": "string", "pattern": "^[a-z]{3,8}$"}}),
    obj({"ip": {"type": "string", "pattern": "^([0-9]{1,3}\\.){3}[0-9]{1,3}$"}}),
    obj({"t": {"type": "string", "format": "time"}}),
    obj({"dt": {"type": "string", "format": "date-time"}}),
    obj({"items": array_of(COLOR, 2, 2)}),
    obj({"meta": {"type": "object", "additionalProperties": AGE, "maxProperties": 2}}),
    obj({"nums": array_of(SCORE, 0, 4)}),
    obj({"x": {"type": ["integer", "null"], "minimum": 0, "maximum": 10}}),
    {"type": "array", "items": obj({"id": AGE}), "minItems": 1, "maxItems": 2},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "integer", "minimum": -50, "maximum": 50},
    {"type": "string", "pattern": "^(cat|dog|bird)$"},
    {"type": "boolean"},
    obj({"address": obj({"street": NAME, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, {"city": NAME})}),
    obj({"name": NAME}, {"nick": NAME, "age": AGE, "tags": TAGS, "flag": FLAG}),
    obj({"empty": obj({})}),
    obj({"anything": {"type": "object", "maxProperties": 1, "additionalProperties": FLAG}}),
]


def generated() -> list[dict]:
    """Variations: the same building blocks at other depths and array bounds."""
    leaves = [NAME, AGE, SCORE, COLOR, CODE, FLAG, DATE, NULLABLE_AGE]
    found = []
    for i, leaf in enumerate(leaves):
        found.append(obj({f"f{i}": leaf, "list": array_of(leaf, 0, 2)}))
        found.append(obj({"outer": obj({f"inner{i}": leaf})}, {"extra": leaf}))
    return found


SCHEMAS = HAND_WRITTEN + generated()


# Seconds to compile (every pattern is a state machine of its own): the test of a slow grammar.
SLOW_SCHEMA = {
    "type": "object",
    "properties": {
        f"q{i}": {
            "type": "object",
            "properties": {f"r{j}": {"type": "string", "pattern": "[a-z]{3,9}[0-9]{2,7}"} for j in range(12)},
        }
        for i in range(60)
    },
}
