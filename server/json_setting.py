"""A setting given as JSON (a flag's text) or as a dict (LLM's keyword argument): read into a dict
of known fields, or refused naming the setting or its unknown field."""

from __future__ import annotations

import json
from typing import Any

from argosy.server.exceptions import InvalidRequestError


def json_object(value: str | dict, field: str, fields: tuple[str, ...]) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"{field} is not JSON: {exc}", param=field) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{field} must be a JSON object", param=field)
    if unknown := sorted(set(value) - set(fields)):
        name = f"{field}.{unknown[0]}"
        raise InvalidRequestError(f"{name} is not supported (supported: {', '.join(fields)})", param=name)
    return value
