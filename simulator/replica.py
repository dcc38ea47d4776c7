"""Replica: one simulated pod. It is created, starts for the pod's start time (scheduling, image,
model load) and is seen ready at the next startup probe; then it serves: an EngineCore (the
engine's own scheduler and KV-cache manager) on a ProfiledExecutor, each step advancing the
clock by the profile's time for it. Deleted, it is out of the endpoints at once, finishes what it
holds for up to its drain time and is gone; a pod still starting is gone at once.

With a warm pool, a pod can also be asleep (vLLM's sleep mode, level 1: its weights in host
memory, no KV cache): started into the pool, or put back there after its drain instead of being
deleted; woken, it serves after the wake time instead of a pod start."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import simpy

from argosy.server.engine.core_protocol import EngineCoreRequest
from argosy.server.engine.engine_core import EngineCore
from argosy.server.engine_config import EngineConfig
from argosy.server.profile.engine_profile import EngineProfile
from argosy.server.sampling_params import SamplingParams
from argosy.simulator.host import SharedHost
from argosy.simulator.profiled_executor import ProfiledExecutor
from argosy.simulator.requests import SimRequest

State = Literal["starting", "ready", "draining", "asleep", "waking", "gone"]
STARTUP_PROBE_SECONDS = 10  # operator/deployment.py's startup probe period


# The settings a profile records that shape the scheduling (all but the model, which may be elsewhere).
SCHEDULING = {"block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len", "enable_chunked_prefill",
              "enable_prefix_caching"}  # fmt: skip


def engine_config(profile: EngineProfile) -> EngineConfig:
    """The profiled engine's settings; its model's config where the checkpoint is on this machine,
    else the embedded default model's (a simulated replica reads only the vocabulary and limits)."""
    s = profile.settings
    model = s.model if (Path(s.model) / "config.json").is_file() else None
    return EngineConfig(model=model, **s.model_dump(include=SCHEDULING))


class Replica:
    def __init__(
        self,
        env: simpy.Environment,
        name: str,
        profile: EngineProfile,
        start_seconds: float,
        drain_seconds: float,
        max_waiting: int,
        host: SharedHost | None = None,
    ):
        self.env = env
        self.name = name
        self.state: State = "starting"
        self.pooled = False  # asleep once started or drained, rather than serving or gone
        self.created = env.now
        self.ended: float | None = None
        self.drain_seconds = drain_seconds
        self.max_waiting = max_waiting
        self.host = host  # the cores it shares with the other replicas, if it does
        self.executor = ProfiledExecutor(profile)
        self.core = EngineCore(engine_config(profile), self.executor)
        self.requests: dict[str, SimRequest] = {}
        self._vocab = self.core.model_config.vocab_size
        self._wake = env.event()
        self._prompts = 0
        self.generated = 0  # its counter of generated tokens
        self.steps = 0  # run, and their simulated seconds: the engine's step histogram
        self.step_seconds = 0.0
        if start_seconds > 0:
            env.process(self._start(start_seconds))
        else:
            self.state = "ready"
        env.process(self._serve())

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    @property
    def scraped(self) -> bool:
        """Its server answers /metrics: serving, or draining."""
        return self.state in ("ready", "draining")

    @property
    def serving(self) -> bool:
        """Counted among the replicas asked for: serving, or on its way to."""
        return not self.pooled and self.state in ("starting", "waking", "ready")

    def wake(self, seconds: float) -> None:
        """Out of the pool: serving after the wake time (or once started, if still starting)."""
        self.pooled = False
        if self.state == "draining":  # taken back before its drain ended
            self.state = "ready"
        elif self.state == "asleep":
            self.state = "waking"
            self.env.process(self._woken(seconds))

    def _woken(self, seconds: float):
        yield self.env.timeout(seconds)
        if self.state == "waking":
            self.state = "ready"

    def gauges(self) -> dict[str, float]:
        """What its /metrics would say now."""
        waiting, running = self.core.num_requests()
        kv = self.core.kv
        return {"waiting": waiting, "running": running, "kv_usage": kv.num_used_blocks / kv.num_blocks}

    def submit(self, request: SimRequest) -> bool:
        """Queues a request; False when its queue is full (the server's 503)."""
        if self.core.num_requests()[0] >= self.max_waiting:
            return False
        trace = request.trace
        prompt = self._prompt(trace.prompt_tokens)
        params = SamplingParams(temperature=0.0, max_tokens=trace.output_tokens, ignore_eos=True)
        self.core.add_request(EngineCoreRequest(request.request_id, prompt, params, self.env.now))
        self.requests[request.request_id] = request
        if not self._wake.triggered:
            self._wake.succeed()
        return True

    def abort(self, request: SimRequest, why: str) -> None:
        self.core.abort(request.request_id)
        self.requests.pop(request.request_id, None)
        request.error = why

    def delete(self, to_pool: bool = False) -> None:
        """Out of the endpoints; with `to_pool`, asleep after its drain rather than gone."""
        self.pooled = to_pool
        if self.state == "starting":
            if not to_pool:
                self._end()
        elif self.state == "waking":
            if to_pool:
                self.state = "asleep"
            else:
                self._end()
        elif self.state == "ready":
            self.state = "draining"
            self.env.process(self._drain_deadline())
            if not self._wake.triggered:
                self._wake.succeed()

    def _prompt(self, length: int) -> list[int]:
        """Distinct prompts, so no request hits another's prefix in the cache: the first two tokens
        number the request, the rest count on."""
        n, vocab = self._prompts, self._vocab
        self._prompts += 1
        head = [n % vocab, n // vocab % vocab]
        return (head + [(n + i) % vocab for i in range(length - 2)])[:length]

    def _start(self, seconds: float):
        yield self.env.timeout(math.ceil(seconds / STARTUP_PROBE_SECONDS) * STARTUP_PROBE_SECONDS)
        if self.state == "starting":
            self.state = "asleep" if self.pooled else "ready"

    def _serve(self):
        while self.state != "gone":
            if not self.core.has_unfinished_requests():
                if self.state == "draining":
                    self._drained()
                    if self.state == "gone":
                        return
                self._wake = self.env.event()
                yield self._wake
                continue
            self.executor.last_seconds = 0.0
            outputs = self.core.step()
            if self.executor.last_seconds == 0.0:
                raise RuntimeError(f"{self.name}: the engine holds requests but ran no step")
            started = self.env.now
            seconds = self.executor.last_seconds
            yield self.env.timeout(seconds) if self.host is None else self.host.run(seconds)
            now = self.env.now
            self.steps += 1
            self.step_seconds += now - started
            for out in outputs:
                request = self.requests.get(out.request_id)
                if request is None:  # aborted while its step ran
                    continue
                request.tokens_at(now, len(out.new_token_ids))
                self.generated += len(out.new_token_ids)
                if out.finish_reason is not None:
                    request.finished = now
                    del self.requests[out.request_id]
            for failure in self.core.take_failed():
                if (request := self.requests.pop(failure.request_id, None)) is not None:
                    request.error = failure.message

    def _drain_deadline(self):
        yield self.env.timeout(self.drain_seconds)
        if self.state == "draining":
            for request in list(self.requests.values()):
                self.abort(request, "cut off by the pod's shutdown")
            self._drained()

    def _drained(self) -> None:
        if self.pooled:
            self.state = "asleep"
        else:
            self._end()

    def _end(self) -> None:
        self.state = "gone"
        self.ended = self.env.now
        if not self._wake.triggered:
            self._wake.succeed()
