"""Async scheduling: the next step is planned and started while the last one runs (a decode's
token, sampled by the step before, filled in on the device side), and nothing
changes in what comes out: the outputs equal the synchronous engine's (greedy, seeded parallel
samples, constraints, logprobs, under chunked prefill and preemption), in the in-process and the
multi-process executor; on a slow device the next plan is made while a step runs; a request
aborted while its step runs (n > 1 too) leaves nothing behind on either side; control calls land
the step in flight first; speculative decoding is refused naming the field."""

from __future__ import annotations

import threading
import time

import pytest

from argosy import SamplingParams, StructuredOutputsParams
from argosy.server.engine.llm_engine import LLMEngine
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from tests.checkpoints import tiny_llm

PROMPTS = [list(range(5, 5 + n)) for n in (40, 7, 90, 3, 25, 60)]
PARAMS = [
    SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
    SamplingParams(n=3, temperature=0.9, seed=7, max_tokens=12, ignore_eos=True, logprobs=2),
    SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(regex="[ab]{3}c")),
    SamplingParams(temperature=0.7, seed=1, max_tokens=20, ignore_eos=True),
    SamplingParams(n=2, temperature=0.0, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop_token_ids=[9]),
]
# 10 blocks of the test model for requests of up to ~110 tokens: chunks, preemptions and returns.
SMALL = {"kv_cache_memory": 10 * 2 * 2 * 16 * 2 * 16 * 4, "max_model_len": 128, "max_num_batched_tokens": 32}


def outputs(llm) -> list:
    done = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS)
    return [
        [(c.token_ids, c.finish_reason, c.logprobs and [list(lp) for lp in c.logprobs]) for c in o.outputs]
        for o in done
    ]


def engine(path, **settings) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(path), dtype="float32", kv_cache_memory=4 << 20, **settings))


@pytest.mark.parametrize("backend", ["uni", "mp"])
def test_the_outputs_equal_the_synchronous_engines(llama_checkpoint, backend):
    expected = outputs(tiny_llm(llama_checkpoint, **SMALL))
    llm = tiny_llm(llama_checkpoint, async_scheduling=True, distributed_executor_backend=backend, **SMALL)
    assert outputs(llm) == expected
    assert llm.stats().num_preemptions > 0 and llm.stats().kv_blocks_used == 0


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "steps"),
    [(list(range(5, 117)), 2, 8), ([5, 6, 7], 9, 9)],
    ids=["prefill chunks", "decodes"],
)
def test_on_a_slow_device_the_next_plan_is_made_while_a_step_runs(llama_checkpoint, prompt, max_tokens, steps):
    """A long prompt's chunks depend on no sampled token, and a decode's token is filled in on the
    device side: each step is planned while the one before runs."""
    llm = tiny_llm(llama_checkpoint, async_scheduling=True, max_num_batched_tokens=16)
    core = llm.engine.core
    worker, planner = core.executor.worker, core.planner
    runs: list[float] = []  # when each step ended
    plans: list[float] = []
    execute, plan = worker.execute, planner.plan

    def slow_execute(step_plan):
        step = len(runs)
        deadline = time.monotonic() + 1.0  # a device step that lasts until the next plan is made, or a second
        while len(plans) <= step + 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        result = execute(step_plan)
        runs.append(time.monotonic())
        return result

    def timed_plan(*args):
        plans.append(time.monotonic())
        return plan(*args)

    worker.execute, planner.plan = slow_execute, timed_plan
    out = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    )
    during = [k for k in range(len(runs) - 1) if plans[k + 1] < runs[k]]  # the next planned before it ended
    assert len(runs) == steps and len(during) == steps - 1
    expected = tiny_llm(llama_checkpoint).generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    )
    assert out[0].outputs[0].token_ids == expected[0].outputs[0].token_ids


def test_a_request_aborted_while_its_step_runs_leaves_nothing_behind(llama_checkpoint):
    held = engine(llama_checkpoint, async_scheduling=True)
    worker = held.core.executor.worker
    release = threading.Event()
    execute = worker.execute

    def waiting(step_plan):
        release.wait(10)
        return execute(step_plan)

    worker.execute = waiting
    keep = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    held.add_request("keep", [5, 6, 7, 8], keep)
    held.add_request("forking", list(range(10, 30)), SamplingParams(n=3, max_tokens=6, ignore_eos=True))
    held.step()  # launched: both prompts, the forks of the second decided
    held.abort("forking")  # while its step runs
    release.set()
    tokens = []
    while held.has_unfinished_requests():
        tokens += [o.outputs[0].token_ids for o in held.step() if o.request_id == "keep" and o.finished]
    alone = engine(llama_checkpoint)
    alone.add_request("keep", [5, 6, 7, 8], keep)
    expected = []
    while alone.has_unfinished_requests():
        expected += [o.outputs[0].token_ids for o in alone.step() if o.finished]
    assert tokens == expected
    core = held.core
    core.drain()
    core.executor.execute(core.planner.plan(core.scheduler.schedule(), [], {}))  # the plan naming what ended
    assert core.requests == {} and core.kv.num_used_blocks == 0 and core.scheduler.running == []
    assert dict(worker.states) == {}


def test_control_calls_land_the_step_in_flight_first(llama_checkpoint):
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    results = {}
    for settings in ({}, {"async_scheduling": True}):
        run = engine(llama_checkpoint, **settings)
        run.add_request("r", list(range(5, 60)), params)
        tokens = [o.outputs[0].token_ids for o in run.step() if o.finished]
        core = run.core
        if settings:
            assert len(core._in_flight) == 1
        assert core.reset_prefix_cache() is False  # landed first, then refused: "r" holds blocks
        assert not core._in_flight
        while run.has_unfinished_requests():
            tokens += [o.outputs[0].token_ids for o in run.step() if o.finished]
        assert core.sleep(1) > 0
        results[bool(settings)] = tokens
    assert results[True] == results[False] and len(results[True][0]) == 3


def test_speculative_decoding_is_refused_naming_the_field():
    with pytest.raises(InvalidRequestError, match="not with speculative decoding") as caught:
        EngineConfig(async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert caught.value.param == "async_scheduling"
