"""SpeculativeConfig: `--speculative-config` (JSON, as vLLM takes it) or
`LLM(speculative_config={...})`, checked field by field: a bad value is refused naming it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from argosy.server.exceptions import InvalidRequestError
from argosy.server.json_setting import json_object

METHODS = ("ngram", "draft_model")
FIELDS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "disable_by_batch_size",
)
DEFAULT_LOOKUP = 5  # n-gram length tried when neither bound is given, as vLLM's
# Past this many running sequences a step is bound by arithmetic rather than by reading the
# weights, and drafts would only slow it. bench/spec_decode.py on a 2-core CPU: prompt lookup
# gained 1.08-1.16x with 16 running; with 24, 32 and 64 it still gained 1.14x, 1.22x and 1.10x,
# but only on outputs it predicts almost whole (95% of drafts kept), its best case; the limit
# stays where every workload measured gained.
DEFAULT_DISABLE_BY_BATCH_SIZE = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # k: tokens proposed, and verified, per step
    prompt_lookup_min: int = DEFAULT_LOOKUP  # ngram: the shortest suffix that may match
    prompt_lookup_max: int = DEFAULT_LOOKUP  # ngram: the longest, tried first
    model: str | None = None  # draft_model: a smaller checkpoint with the same vocabulary
    disable_by_batch_size: int = DEFAULT_DISABLE_BY_BATCH_SIZE  # no speculation with more running

    @classmethod
    def parse(cls, value: str | dict | SpeculativeConfig | None) -> SpeculativeConfig | None:
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        field = "speculative_config"
        value = json_object(value, field, FIELDS)
        method = value.get("method")
        if method not in METHODS:
            raise InvalidRequestError(
                f"{field}.method must be one of {', '.join(METHODS)}, got {method!r}", param=f"{field}.method"
            )
        k = _positive(value, "num_speculative_tokens", required=True)
        low, high = _positive(value, "prompt_lookup_min"), _positive(value, "prompt_lookup_max")
        low, high = low or high or DEFAULT_LOOKUP, high or low or DEFAULT_LOOKUP
        if low > high:
            raise InvalidRequestError(
                f"{field}.prompt_lookup_min ({low}) must not exceed prompt_lookup_max ({high})",
                param=f"{field}.prompt_lookup_min",
            )
        model = value.get("model")
        if (method == "draft_model") != (model is not None) or (model is not None and not isinstance(model, str)):
            need = (
                "draft_model needs a model (a checkpoint folder)" if model is None else "only draft_model takes a model"
            )
            raise InvalidRequestError(f"{field}: {need}", param=f"{field}.model")
        by_batch = _positive(value, "disable_by_batch_size") or DEFAULT_DISABLE_BY_BATCH_SIZE
        return cls(method, k, low, high, model, by_batch)


def _positive(value: dict[str, Any], name: str, required: bool = False) -> int | None:
    given = value.get(name)
    if given is None and not required:
        return None
    if not isinstance(given, int) or isinstance(given, bool) or given < 1:
        raise InvalidRequestError(
            f"speculative_config.{name} must be a positive integer, got {given!r}", param=f"speculative_config.{name}"
        )
    return given
