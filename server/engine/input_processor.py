"""InputProcessor: turns a prompt (text or token ids) and its SamplingParams into a validated
NewRequest, without touching the engine's queues, so that the HTTP layer may do it while the
engine steps. NewRequest holds what the core gets and what stays with the API process."""

from __future__ import annotations

import time
from dataclasses import dataclass

from argosy.server.engine.core_protocol import EngineCoreRequest
from argosy.server.engine.request_options import PLAIN, RequestOptions
from argosy.server.engine_config import EngineConfig, resolve_limits, tokenizer_path
from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig
from argosy.server.sampling_params import SamplingParams
from argosy.server.scheduling.policy import SchedulingPolicy
from argosy.server.text.tokenizer import Tokenizer


@dataclass
class NewRequest:
    core: EngineCoreRequest  # what the engine core receives
    prompt: str | None  # the prompt's text, when it came as text

    @property
    def request_id(self) -> str:
        return self.core.request_id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.core.prompt_token_ids

    @property
    def params(self) -> SamplingParams:
        return self.core.params

    @property
    def arrival_time(self) -> float:
        return self.core.arrival_time


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        max_model_len: int,
        max_num_seqs: int,
        max_logprobs: int = 20,
        scheduling_policy: SchedulingPolicy = "fcfs",
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_logprobs = max_logprobs
        self.scheduling_policy = scheduling_policy

    @classmethod
    def for_model(cls, config: EngineConfig) -> InputProcessor:
        """What the API process needs of the checkpoint: its tokenizer and limits, read from
        its files without loading the weights."""
        path = resolve_model_path(config.model)
        model_config = ModelConfig.from_folder(path)
        limits = resolve_limits(config, model_config)
        tokenizer = Tokenizer(tokenizer_path(config, path))
        return cls(
            tokenizer, model_config.vocab_size, limits.max_model_len, config.max_num_seqs, config.max_logprobs,
            config.scheduling_policy,
        )  # fmt: skip

    def make_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        add_special_tokens: bool = True,
        options: RequestOptions = PLAIN,
    ) -> NewRequest:
        """Raises InvalidRequestError, naming the field, when the request cannot be served.
        A rendered chat prompt has its special tokens already (add_special_tokens=False)."""
        params.validate()
        options.check(self.scheduling_policy)
        if options.kv_transfer is not None and params.n > 1:
            raise InvalidRequestError("kv_transfer_params are for one output: n must be 1", param="kv_transfer_params")
        text = prompt if isinstance(prompt, str) else None
        if text is not None and (fewest := self.tokenizer.fewest_tokens(text)) >= self.max_model_len:
            raise InvalidRequestError(  # certain from its length alone: not worth tokenizing
                f"the prompt has at least {fewest} tokens ({len(text)} characters); max_model_len is "
                f"{self.max_model_len}",
                param="prompt",
            )
        token_ids = self.tokenizer.encode(text, add_special_tokens) if text is not None else list(prompt)
        self._check(token_ids, params)
        arrival = arrival_time or time.monotonic()
        core = EngineCoreRequest(request_id, token_ids, params, arrival, options)
        return NewRequest(core, text)

    def _check(self, token_ids: list[int], params: SamplingParams) -> None:
        max_len, vocab = self.max_model_len, self.vocab_size
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        if len(token_ids) >= max_len:
            raise InvalidRequestError(
                f"the prompt has {len(token_ids)} tokens; max_model_len is {max_len}, which leaves no room for output",
                param="prompt",
            )
        if params.max_tokens is not None and len(token_ids) + params.max_tokens > max_len:
            raise InvalidRequestError(
                f"max_tokens ({params.max_tokens}) plus the prompt's {len(token_ids)} tokens exceeds max_model_len "
                f"({max_len})",
                param="max_tokens",
            )
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})", param="prompt")
        bad = next((t for t in params.logit_bias or () if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"logit_bias token id {bad} is outside the vocabulary [0, {vocab})", "logit_bias")
        bad = next((t for t in params.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(
                f"stop token id {bad} is outside the vocabulary [0, {vocab})", param="stop_token_ids"
            )
        if params.logprobs is not None and params.logprobs > self.max_logprobs:
            raise InvalidRequestError(
                f"logprobs ({params.logprobs}) exceeds the server's max_logprobs ({self.max_logprobs})",
                param="logprobs",
            )
        if params.n > self.max_num_seqs:
            raise InvalidRequestError(f"n ({params.n}) exceeds max_num_seqs ({self.max_num_seqs})", param="n")
