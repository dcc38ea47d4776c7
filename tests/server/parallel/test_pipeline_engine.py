"""The engine with pipeline parallelism on CPU processes over gloo: the decoder layers split into
stages, each stage's activations passed to the next, and greedy tokens equal to transformers'
alone and composed with tensor parallelism."""

from __future__ import annotations

import os
import signal
import time

import pytest

from argosy import LLM, SamplingParams
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.multiproc import RankDiedError
from tests.checkpoints import build_checkpoint, load_reference, reference_greedy, tiny_llm
from tests.polling import wait_until
from tests.server.models.test_greedy_identity import mixed_requests, run


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("pp") / "llama", "llama", num_hidden_layers=4)


@pytest.mark.parametrize(("tensor", "pipeline"), [(1, 2), (2, 2), (1, 4)], ids=["pp2", "tp2xpp2", "pp4"])
def test_greedy_tokens_equal_transformers_across_stages(four_layers, tensor, pipeline):
    requests = mixed_requests(8, seed=1)
    model = load_reference(four_layers)
    expected = [reference_greedy(model, p, n) for p, n in requests]
    llm = tiny_llm(
        four_layers,
        tensor_parallel_size=tensor,
        pipeline_parallel_size=pipeline,
        max_model_len=384,
        max_num_batched_tokens=64,
    )
    assert run(llm, requests) == expected
    # The stages said at start-up: the first embeds, the last holds the norm and the head.
    layers = 4 // pipeline
    stages = [f"layers {i * layers}-{(i + 1) * layers - 1}" for i in range(pipeline)]
    line = llm.engine.core.device.startup
    assert f"pipeline of {pipeline} stages (stage 0: embedding, {stages[0]}; " in line
    assert f"stage {pipeline - 1}: {stages[-1]}, norm and LM head)" in line


def test_a_killed_rank_of_any_stage_fails_the_next_step_and_no_rank_is_left(four_layers):
    llm = tiny_llm(four_layers, pipeline_parallel_size=2)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    llm.generate({"prompt_token_ids": [5, 6, 7]}, params)
    procs = llm.engine.core.executor.procs
    os.kill(procs[0].pid, signal.SIGKILL)  # the first stage: the driver, on the last, waits on its activations
    wait_until(lambda: not procs[0].is_alive(), 30, "the rank to die")
    started = time.monotonic()
    with pytest.raises(RankDiedError, match="rank 0 exited"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, params)
    assert time.monotonic() - started < 10
    assert not any(proc.is_alive() for proc in procs)


@pytest.mark.parametrize(
    ("settings", "param", "words"),
    [
        ({"pipeline_parallel_size": 5}, "pipeline_parallel_size", "exceeds the model's 4 decoder layers"),
        ({"enable_lora": True}, "enable_lora", "not served with pipeline_parallel_size above 1"),
        ({"speculative_config": {"method": "ngram", "num_speculative_tokens": 2}}, "speculative_config", "not served"),
        ({"swap_space": 0.01}, "swap_space", "not served"),
        ({"distributed_executor_backend": "uni"}, "distributed_executor_backend", "must be mp"),
    ],
    ids=["too-many-stages", "lora", "speculative", "host-tier", "one-process"],
)
def test_what_pipeline_stages_cannot_serve_is_refused_by_name(four_layers, settings, param, words):
    with pytest.raises(InvalidRequestError, match=words) as refused:
        tiny_llm(four_layers, **{"pipeline_parallel_size": 2, **settings})
    assert refused.value.param == param


def test_the_default_model_in_two_stages_gives_one_ranks_tokens():
    """SmolLM2's 30 layers as 15 + 15, and as two stages of 3 tensor-parallel ranks (its 9 heads
    split in three, not two: the two-by-two case runs on the four-layer model above). In float32
    the handover between stages changes no greedy token."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    tokens = {}
    for tensor, pipeline in ((1, 1), (1, 2), (3, 2)):
        llm = LLM(
            dtype="float32",
            tensor_parallel_size=tensor,
            pipeline_parallel_size=pipeline,
            kv_cache_memory=64 << 20,
            max_model_len=512,
        )
        tokens[tensor, pipeline] = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        del llm
    assert tokens[1, 2] == tokens[1, 1]
    assert tokens[3, 2] == tokens[1, 1]


class RecordedStep:
    """A step's handle that notes when the engine takes its result in."""

    def __init__(self, handle, index: int, events: list):
        self.handle, self.index, self.events = handle, index, events

    def result(self):
        self.events.append(("land", self.index, ()))
        return self.handle.result()


@pytest.mark.parametrize("stages", [2, 4])
def test_micro_batches_take_turns_with_one_per_stage_in_flight(four_layers, stages):
    """The micro-batch schedule: P steps in the stages at once (each launched before the oldest
    lands), each carrying 1/P of the decoding sequences, the P in flight disjoint, and the
    tokens those of one rank."""
    prompts = [{"prompt_token_ids": [7 + i, 8, 9, 10, 11]} for i in range(8)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    expected = [out.outputs[0].token_ids for out in tiny_llm(four_layers).generate(prompts, params)]
    llm = tiny_llm(four_layers, pipeline_parallel_size=stages)
    core, events = llm.engine.core, []
    launch = core.executor.execute_async

    def recording(plan):
        index = sum(kind == "launch" for kind, _, _ in events)
        events.append(("launch", index, tuple(sorted(chunk.seq_id for chunk in plan.chunks))))
        return RecordedStep(launch(plan), index, events)

    core.executor.execute_async = recording
    assert [out.outputs[0].token_ids for out in llm.generate(prompts, params)] == expected
    launched, in_flight, most = {}, set(), 0
    for kind, index, seqs in events:
        if kind == "launch":
            assert not set(seqs) & {s for i in in_flight for s in launched[i]}, "a sequence in two steps in flight"
            launched[index] = seqs
            in_flight.add(index)
            most = max(most, len(in_flight))
        else:
            assert index == min(in_flight), "steps land in the order they were launched"
            in_flight.remove(index)
    assert most == stages
    decodes = [seqs for seqs in launched.values() if seqs]
    assert max(len(seqs) for seqs in decodes) == 8 // stages
    # In the steady state every P consecutive steps carry each sequence exactly once.
    middle = decodes[stages : stages * 8]
    for first in range(len(middle) - stages + 1):
        window = [s for seqs in middle[first : first + stages] for s in seqs]
        assert sorted(window) == sorted(set(window)) and len(window) == 8
