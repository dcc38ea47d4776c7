"""The request fields that constrain an output, read into one StructuredOutputsParams: OpenAI's
`response_format`, vLLM's `structured_outputs`, and the older `guided_*` fields, which mean the
same. Every field that is sent is enforced or refused with a 400 naming it: none is ignored."""

from __future__ import annotations

from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.params import KINDS, StructuredOutputsParams

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# structured_outputs' own options beside the constraint; disable_fallback asks for what always
# holds here (there is no second grammar library to fall back to).
OPTIONS = ("disable_any_whitespace", "disable_fallback")
BACKENDS = ("auto", "xgrammar")


def read_constraints(body: Any) -> StructuredOutputsParams | None:
    """The one constraint of a request body (None without one)."""
    found = [c for c in (_response_format(body), _structured_outputs(body), _guided(body)) if c is not None]
    if len(found) > 1:
        fields = " and ".join(c.field for c in found)
        raise InvalidRequestError(f"a request takes one constraint; got {fields}", param=found[1].field)
    return found[0] if found else None


def _response_format(body: Any) -> StructuredOutputsParams | None:
    spec = body.response_format
    if spec is None:
        return None
    kind = spec.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True, field="response_format")
    if kind != "json_schema":
        raise InvalidRequestError(
            f"response_format.type must be text, json_object or json_schema, got {kind!r}",
            param="response_format.type",
        )
    inner = spec.get("json_schema")
    if not isinstance(inner, dict) or not isinstance(inner.get("schema"), dict):
        raise InvalidRequestError(
            "response_format.json_schema must be an object with a 'schema' object",
            param="response_format.json_schema",
        )
    name = inner.get("name")
    if name is not None and not (isinstance(name, str) and name):
        raise InvalidRequestError(
            "response_format.json_schema.name must be a non-empty string", param="response_format.json_schema.name"
        )
    # strict: false allows what strict: true enforces, so enforcing it always answers both.
    return StructuredOutputsParams(json=inner["schema"], field="response_format.json_schema.schema")


def _structured_outputs(body: Any) -> StructuredOutputsParams | None:
    spec = body.structured_outputs
    if spec is None:
        return None
    unknown = sorted(set(spec) - set(KINDS) - set(OPTIONS))
    if unknown:
        raise InvalidRequestError(
            f"structured_outputs.{unknown[0]} is not supported (supported: {', '.join(KINDS + OPTIONS)})",
            param=f"structured_outputs.{unknown[0]}",
        )
    given = [k for k in KINDS if spec.get(k) is not None]
    field = f"structured_outputs.{given[0]}" if len(given) == 1 else "structured_outputs"
    constraint = {k: spec[k] for k in given}
    return StructuredOutputsParams(
        **constraint, disable_any_whitespace=bool(spec.get("disable_any_whitespace")), field=field
    )


def _guided(body: Any) -> StructuredOutputsParams | None:
    backend = body.guided_decoding_backend
    if backend is not None and backend not in BACKENDS:
        raise InvalidRequestError(
            f"guided_decoding_backend must be one of {', '.join(BACKENDS)}, got {backend!r}",
            param="guided_decoding_backend",
        )
    if body.guided_whitespace_pattern is not None:
        raise InvalidRequestError(
            "guided_whitespace_pattern is not supported; whitespace in JSON is bounded (or, with "
            "structured_outputs.disable_any_whitespace, none)",
            param="guided_whitespace_pattern",
        )
    given = {field: getattr(body, field) for field in GUIDED if getattr(body, field) is not None}
    if not given:
        return None
    if len(given) > 1:
        first, second = list(given)[:2]
        raise InvalidRequestError(f"a request takes one constraint; got {first} and {second}", param=second)
    ((field, value),) = given.items()
    return StructuredOutputsParams(**{GUIDED[field]: value}, field=field)
