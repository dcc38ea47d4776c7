"""Latency objectives -> the KEDA thresholds that keep them, from the engine's profile and a
queueing model of one replica.

A replica decodes in steps; with B requests running, each of P prompt and O output tokens, a step
carries B decodes (reading about P + O/2 positions each) and, in steady state, the prompts of the
requests that replace the finished ones: B/O of them per step, B·P/O prompt tokens. So the step
time is linear in B, t(B) = t0 + k·B (t0, k from the profile's coefficients), and the ITL objective
I caps the batch: B* = max B with t(B*) <= I (and within the sequence cap and the KV cache).

- output tokens per second per replica: B*/t(B*), what a replica generates at B*. Throughput
  follows demand (unlike running requests, whose count per request shrinks with the batch, so a
  fleet sized on them shrinks until it is too small, grows back, and flaps; and unlike a queue,
  which reads 0 whenever the fleet keeps up).
- waiting requests per replica: at B* a replica frees a batch slot every t(B*)·O/B* seconds on
  average; modelling departures as Poisson at rate r = B*/(t(B*)·O), the q-th waiting request
  starts after an Erlang(q, r) time. The target is the largest q whose p-th percentile of that
  wait, plus the prompt's own prefill, stays within the TTFT objective; plus the prompts one step
  admits (max_num_batched_tokens / P), which wait a step at most whenever a batch slot is free:
  when latency is dominated by queue time, this trigger scales.
- KV-cache usage per replica: what B* requests of P + O/2 tokens hold, so that long contexts
  that fill the cache before the batch fills scale the fleet as well (at most 0.9).

A threshold set by the user (targetWaitingRequests) wins over the derived one."""

from __future__ import annotations

import math
from dataclasses import dataclass

from argosy.operator.spec import ObjectivesSpec
from argosy.server.profile.engine_profile import EngineProfile
from argosy.server.profile.step_shape import StepShape

MAX_KV_USAGE = 0.9  # the busiest a replica's KV cache is planned at: the rest absorbs longer contexts


PROFILE_KEY = "profile.json"  # in the ConfigMap spec.autoscaling.objectives.profileConfigMap names


def thresholds_from_config_map(config_map: dict | None, objectives: ObjectivesSpec) -> Thresholds:
    """Raises ValueError naming the field when the ConfigMap, its profile or the objectives fail."""
    field = "spec.autoscaling.objectives.profileConfigMap"
    name = objectives.profileConfigMap
    if config_map is None:
        raise ValueError(f"{field}: ConfigMap {name} does not exist")
    text = (config_map.get("data") or {}).get(PROFILE_KEY)
    if text is None:
        raise ValueError(f"{field}: ConfigMap {name} has no key {PROFILE_KEY}")
    try:
        profile = EngineProfile.model_validate_json(text)
    except ValueError as exc:
        raise ValueError(f"{field}: ConfigMap {name}'s {PROFILE_KEY} is no engine profile: {exc}") from None
    try:
        return thresholds_for(profile, objectives)
    except ObjectivesUnreachable as exc:
        raise ValueError(f"spec.autoscaling.objectives: {exc}") from None


class ObjectivesUnreachable(ValueError):
    """No replica of this profile meets the objectives, however few requests it runs."""


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Thresholds:
    running_requests: int  # B*
    tokens_per_second: float  # B* / t(B*)
    waiting_requests: int
    kv_cache_usage: float
    step_seconds: float  # t(B*): the ITL a full replica gives

    def as_status(self) -> dict[str, float | int]:
        return {
            "runningRequests": self.running_requests,
            "outputTokensPerSecond": round(self.tokens_per_second, 2),
            "waitingRequests": self.waiting_requests,
            "kvCacheUsage": round(self.kv_cache_usage, 3),
            "interTokenLatencySeconds": round(self.step_seconds, 4),
        }


def steady_step_seconds(profile: EngineProfile, batch: int, work: Workload) -> float:
    """t(B): a step of `batch` decodes with the prompts that replace finished requests."""
    prompts = batch / work.output_tokens
    prompt_tokens = prompts * work.prompt_tokens
    shape = StepShape(
        steps=1,
        prefill_tokens=round(prompt_tokens),
        prefill_attention=prompts * work.prompt_tokens * (work.prompt_tokens + 1) / 2 / 1000,
        decode_seqs=batch,
        decode_context=batch * (work.prompt_tokens + work.output_tokens // 2),
        samples=batch + math.ceil(prompts),
    )
    return profile.step_seconds(shape)


def thresholds_for(profile: EngineProfile, objectives: ObjectivesSpec) -> Thresholds:
    return derive_thresholds(
        profile,
        objectives.timeToFirstTokenSeconds,
        objectives.interTokenLatencySeconds,
        objectives.percentile,
        Workload(objectives.promptTokens, objectives.outputTokens),
    )


def derive_thresholds(
    profile: EngineProfile, ttft_seconds: float, itl_seconds: float, percentile: float, work: Workload
) -> Thresholds:
    s = profile.settings
    context = work.prompt_tokens + work.output_tokens
    if context > s.max_model_len:
        raise ObjectivesUnreachable(f"{context} tokens per request exceed the profiled max_model_len {s.max_model_len}")
    capacity = s.num_blocks * s.block_size
    most = min(s.max_num_seqs, int(MAX_KV_USAGE * capacity // context))
    batch = 0
    while batch < most and steady_step_seconds(profile, batch + 1, work) <= itl_seconds:
        batch += 1
    if batch == 0:
        raise ObjectivesUnreachable(
            f"one request alone decodes at {steady_step_seconds(profile, 1, work):.3f} s per token on this profile, "
            f"above the inter-token latency objective of {itl_seconds} s"
        )
    step = steady_step_seconds(profile, batch, work)
    prefill = profile.step_seconds(_prompt_alone(work.prompt_tokens))
    if prefill > ttft_seconds:
        raise ObjectivesUnreachable(
            f"a prompt of {work.prompt_tokens} tokens alone takes {prefill:.3f} s to its first token on this profile, "
            f"above the time-to-first-token objective of {ttft_seconds} s"
        )
    departures = batch / (step * work.output_tokens)
    admitted = s.max_num_batched_tokens // work.prompt_tokens
    waiting = _longest_queue(departures, ttft_seconds - prefill, percentile / 100) + admitted
    usage = min(MAX_KV_USAGE, batch * (work.prompt_tokens + work.output_tokens / 2) / capacity)
    return Thresholds(batch, batch / step, max(waiting, 1), usage, step)


def _prompt_alone(tokens: int) -> StepShape:
    return StepShape(1, tokens, tokens * (tokens + 1) / 2 / 1000, 0, 0, 1)


def _longest_queue(rate: float, budget: float, quantile: float) -> int:
    """The largest q whose Erlang(q, rate) wait is within `budget` at `quantile`."""
    q = 0
    while _erlang_cdf(q + 1, rate, budget) >= quantile:
        q += 1
    return q


def _erlang_cdf(k: int, rate: float, x: float) -> float:
    """P(the sum of k exponential(rate) times <= x)."""
    lam = rate * x
    term, tail = math.exp(-lam), 0.0
    for n in range(k):
        tail += term
        term *= lam / (n + 1)
    return 1.0 - tail
