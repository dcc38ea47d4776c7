"""SamplingParams: how one request is decoded. Names and defaults follow vLLM."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.params import StructuredOutputsParams

# Below this a temperature is treated as greedy: dividing logits by it would overflow.
GREEDY_EPSILON = 1e-5


class RequestOutputKind(enum.IntEnum):
    """What each of a request's outputs holds, as in vLLM."""

    CUMULATIVE = 0  # everything so far
    DELTA = 1  # only what is new since the previous output
    FINAL_ONLY = 2  # one output, once the request has finished


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: every token is a candidate
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives per token
    skip_special_tokens: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    structured_outputs: StructuredOutputsParams | None = None  # the constraint its output satisfies
    logit_bias: dict[int, float] | None = None  # added to the logits of these token ids, as OpenAI's
    stop_strings: tuple[str, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop_strings = (self.stop,)
        else:
            self.stop_strings = tuple(self.stop or ())
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_EPSILON

    def seed_of(self, index: int) -> int | None:
        """The seed of the generator of the request's output `index`: each of the n outputs
        draws from its own stream, as in vLLM, seeded with seed + index."""
        return None if self.seed is None else self.seed + index

    def may_stop(self, num_output_tokens: int) -> bool:
        """Whether a stop (eos, a stop token, a stop string) may end a sequence that has this
        many output tokens: the one rule of min_tokens, for the sampler, the core's stop checks
        and the API's stop strings alike."""
        return num_output_tokens >= self.min_tokens

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self) -> None:
        for name, (low, high) in INTEGER_BOUNDS.items():
            value = getattr(self, name)
            if value is not None or name not in OPTIONAL:
                _check(
                    _integer(value) and low <= value < high,
                    name,
                    f"{name} must be an integer in {_span(low, high)}, got {value!r}",
                )
        _check(self.temperature >= 0.0, "temperature", f"temperature must be non-negative, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        _check(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2.0 <= value <= 2.0, name, f"{name} must be in [-2, 2], got {value}")
        _check(
            self.repetition_penalty > 0.0,
            "repetition_penalty",
            f"repetition_penalty must be positive, got {self.repetition_penalty}",
        )
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop_strings), "stop", "stop strings must be non-empty strings"
        )
        _check(
            all(_integer(t) and 0 <= t < TOKEN_ID_BOUND for t in self.stop_token_ids),
            "stop_token_ids",
            f"stop_token_ids must be integers in {_span(0, TOKEN_ID_BOUND)}, got {self.stop_token_ids}",
        )
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            _check(math.isfinite(getattr(self, name)), name, f"{name} must be a finite number")
        for token, bias in (self.logit_bias or {}).items():
            _check(
                _integer(token) and 0 <= token < TOKEN_ID_BOUND,
                "logit_bias",
                f"logit_bias keys must be token ids in {_span(0, TOKEN_ID_BOUND)}, got {token!r}",
            )
            _check(
                isinstance(bias, int | float) and -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,  # NaN fails it too
                "logit_bias",
                f"logit_bias values must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {bias!r} for token {token}",
            )
        # A grammar complete before min_tokens would leave no token to choose. JSON is never empty: one
        # token is always due (the vLLM router's prefill leg asks min_tokens 1, whatever the constraint).
        constraint = self.structured_outputs
        _check(
            constraint is None or self.min_tokens == 0 or (self.min_tokens == 1 and constraint.kind in JSON_KINDS),
            "min_tokens",
            "min_tokens cannot be combined with structured outputs (the grammar decides where the output ends), "
            "but for min_tokens 1 with JSON",
        )


JSON_KINDS = ("json", "json_object")  # constraints whose every output has at least one token


# Each integer field's bounds, [low, high): its meaning's, within what the engine core's wire
# codec (MessagePack, 64 bits) and the device's int32 and int64 tensors carry.
INT32, INT64 = 2**31, 2**63
TOKEN_ID_BOUND = INT32  # the vocabulary's size bounds them further, where the model is known
INTEGER_BOUNDS = {
    "n": (1, INT32),
    "top_k": (-1, INT32),  # -1 and 0: disabled
    "seed": (-INT64, INT64),
    "max_tokens": (1, INT32),
    "min_tokens": (0, INT32),
    "logprobs": (0, INT32),
}
OPTIONAL = {"seed", "max_tokens", "logprobs"}  # None: no seed, up to max_model_len, none
MAX_LOGIT_BIAS = 100  # OpenAI's bound


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _span(low: int, high: int) -> str:
    return f"[{low}, {high})" if high < 2**20 else f"[{_power(low)}, {_power(high)})"


def _power(value: int) -> str:
    """2^31 rather than 2147483648 in a message."""
    if value in (0, -1, 1):
        return str(value)
    sign = "-" if value < 0 else ""
    return f"{sign}2^{abs(value).bit_length() - 1}"


def _check(ok: bool, param: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(message, param=param)
