"""StructuredOutputsParams: the one constraint a request's output must satisfy, as vLLM names
its fields: a JSON schema, a regular expression, one of a list of choices, a grammar (EBNF or
Lark, as the grammar library reads it), or any JSON object. Plain data, so that it travels with
SamplingParams to the engine core and the device side."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from argosy.server.exceptions import InvalidRequestError

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema (kept as its JSON text)
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False  # JSON without whitespace between its tokens
    # The request field it came from, named in errors found later (a compile past its limit).
    field: str = "structured_outputs"

    def __post_init__(self) -> None:
        if isinstance(self.json, type) and hasattr(self.json, "model_json_schema"):  # a pydantic model
            self.json = self.json.model_json_schema()
        if isinstance(self.json, dict):
            self.json = json.dumps(self.json, ensure_ascii=False)  # its order is the output's
        given = [kind for kind in KINDS if getattr(self, kind) not in (None, False)]
        if len(given) != 1:
            what = f"{len(given)} ({', '.join(given)})" if given else "none"
            raise InvalidRequestError(
                f"structured outputs take exactly one of {', '.join(KINDS)}; got {what}", param=self.field
            )
        self._check_values()

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) not in (None, False))

    @property
    def value(self) -> Any:
        return getattr(self, self.kind)

    @property
    def key(self) -> str:
        """What identifies the compiled grammar: equal constraints share one compile."""
        spec = json.dumps([self.kind, self.value, self.disable_any_whitespace], ensure_ascii=False)
        return hashlib.sha256(spec.encode()).hexdigest()

    def _check_values(self) -> None:
        kind, value = self.kind, self.value
        if kind == "json":
            try:
                schema = json.loads(value)
            except (TypeError, ValueError) as exc:
                raise InvalidRequestError(
                    f"{self.field}: the JSON schema is not JSON: {exc}", param=self.field
                ) from exc
            if not isinstance(schema, (dict, bool)):
                raise InvalidRequestError(f"{self.field}: a JSON schema must be an object", param=self.field)
        elif kind == "choice":
            if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
                raise InvalidRequestError(
                    f"{self.field}: choice must be a non-empty list of non-empty strings", param=self.field
                )
        elif kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            raise InvalidRequestError(f"{self.field}: {kind} must be a non-empty string", param=self.field)
        elif kind == "json_object" and value is not True:
            raise InvalidRequestError(f"{self.field}: json_object must be true", param=self.field)
