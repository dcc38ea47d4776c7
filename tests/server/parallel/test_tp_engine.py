"""The engine with tensor parallelism on CPU processes: greedy tokens equal transformers' for
every architecture with the KV heads split (2 ranks) and replicated (4), through chunked
prefill, prefix hits, preemption and n > 1, and with the host KV tier; a rank killed with -9 fails the next step and
leaves no rank running; the sizes and settings it refuses."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import torch.distributed

from argosy import LLM, SamplingParams, StructuredOutputsParams
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.multiproc import RankDiedError
from argosy.server.parallel.group import check_visible_gpus
from tests.checkpoints import ARCHS, build_checkpoint, load_reference, reference_greedy, tiny_llm
from tests.polling import wait_until
from tests.processes import MODEL, alive, children, serve_process
from tests.server.models.test_greedy_identity import mixed_requests, run

FULL_BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # a block of the whole test model; a rank's is smaller


@pytest.mark.parametrize("size", [2, 4], ids=["kv-split", "kv-replicated"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_equal_transformers_through_chunks_prefix_hits_and_preemption(checkpoints, arch, size):
    requests = mixed_requests(16, seed=1)
    model = load_reference(checkpoints[arch])
    expected = [reference_greedy(model, p, n) for p, n in requests]
    # 12 whole-model blocks of bytes: 24 blocks of a rank's heads, too few for 16 requests at once.
    llm = tiny_llm(
        checkpoints[arch],
        tensor_parallel_size=size,
        kv_cache_memory=12 * FULL_BLOCK_BYTES,
        max_model_len=384,
        max_num_batched_tokens=64,
    )
    assert llm.stats().kv_blocks_total == 24
    assert run(llm, requests) == expected
    stats = llm.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0 and stats.kv_blocks_used == 0


def test_the_host_kv_tier_runs_per_rank_with_outputs_unchanged(llama_checkpoint):
    """Each rank stores its own heads of an evicted block in its own host slots and loads them
    back in the same step as the others: preempted and returning sequences continue exactly."""
    requests = mixed_requests(24, seed=3)
    model = load_reference(llama_checkpoint)
    expected = [reference_greedy(model, p, n) for p, n in requests]
    llm = tiny_llm(
        llama_checkpoint,
        tensor_parallel_size=2,
        kv_cache_memory=12 * FULL_BLOCK_BYTES,
        swap_space=128 * FULL_BLOCK_BYTES / 2**30,  # 256 blocks of a rank's heads
        max_model_len=384,
        max_num_batched_tokens=128,
    )
    assert run(llm, requests) == expected
    host = llm.engine.core.kv.connector.stats()
    assert llm.stats().num_preemptions > 0 and host.blocks_loaded > 0 and host.blocks_total == 256


def test_a_vocabulary_the_ranks_cannot_share_equally(tmp_path):
    """322 token rows over 4 ranks: 81 each, the last rank's 79 and 2 of padding, whose logits
    never reach the sampler (a grammar's mask edits the gathered rows in place)."""
    path = build_checkpoint(tmp_path / "llama", "llama", vocab_size=322)
    requests = mixed_requests(6, seed=4)
    model = load_reference(path)
    expected = [reference_greedy(model, p, n) for p, n in requests]
    llm = tiny_llm(path, tensor_parallel_size=4)
    assert run(llm, requests) == expected
    choice = SamplingParams(temperature=0.0, max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["ab"]))
    assert llm.generate("pick", choice)[0].outputs[0].text == "ab"


def test_parallel_samples_with_two_ranks(llama_checkpoint):
    prompt = list(range(3, 40))
    expected = reference_greedy(load_reference(llama_checkpoint), prompt, 12)
    llm = tiny_llm(llama_checkpoint, tensor_parallel_size=2)
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(n=3, temperature=0.0, max_tokens=12))[0]
    assert [o.token_ids for o in out.outputs] == [expected] * 3


def test_a_rank_killed_fails_the_next_step_and_no_rank_is_left(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, tensor_parallel_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    llm.generate({"prompt_token_ids": [5, 6, 7]}, params)
    procs = llm.engine.core.executor.procs
    os.kill(procs[2].pid, signal.SIGKILL)
    wait_until(lambda: not procs[2].is_alive(), 30, "the rank to die")
    with pytest.raises(RankDiedError, match="rank 2 exited"):
        llm.generate({"prompt_token_ids": [5, 6, 7]}, params)
    assert not any(proc.is_alive() for proc in procs)


def test_more_ranks_than_visible_gpus_are_refused_with_the_numbers():
    check_visible_gpus(2, 2)
    with pytest.raises(InvalidRequestError, match="tensor_parallel_size 4 needs 4 GPUs; visible: 1") as caught:
        check_visible_gpus(4, 1)
    assert caught.value.param == "tensor_parallel_size"


def test_a_torch_without_the_collectives_is_refused(llama_checkpoint, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_gloo_available", lambda: False)
    with pytest.raises(InvalidRequestError, match=r"needs torch\.distributed's gloo") as caught:
        tiny_llm(llama_checkpoint, tensor_parallel_size=2)
    assert caught.value.param == "tensor_parallel_size"


def test_sizes_and_settings_it_refuses_name_the_field(llama_checkpoint):
    with pytest.raises(InvalidRequestError, match="4 attention heads, which 3 ranks") as caught:
        tiny_llm(llama_checkpoint, tensor_parallel_size=3)
    assert caught.value.param == "tensor_parallel_size"
    with pytest.raises(InvalidRequestError, match="distributed_executor_backend must be mp") as caught:
        tiny_llm(llama_checkpoint, tensor_parallel_size=2, distributed_executor_backend="uni")
    assert caught.value.param == "distributed_executor_backend"


def test_under_argosy_serve_a_killed_rank_fails_the_server_as_a_dead_core_does(llama_checkpoint):
    body = {"model": MODEL, "prompt": "once upon a time", "max_tokens": 4}
    with serve_process(llama_checkpoint, "--tensor-parallel-size", "2") as server:
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 200
        [core] = children(server.popen.pid)
        # The core's children: the ranks' processes (spawned, rank 1 after rank 0), and
        # multiprocessing's resource tracker.
        ranks = [pid for pid in children(core) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(ranks) == 2
        rank = max(ranks)
        os.kill(rank, signal.SIGKILL)
        failed = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert failed.status_code == 500
        assert server.popen.wait(30) == 70
        assert "rank 1 exited" in server.output()
        wait_until(lambda: not alive(core) and not alive(rank), 30, "every rank gone")


def test_the_default_model_at_three_ranks_gives_one_ranks_tokens_and_two_ranks_are_refused():
    """SmolLM2's 9 query heads and 3 KV heads split three ways; in float32 the all-reduce's
    order of summing leaves greedy tokens unchanged."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    texts = {}
    for size in (1, 3):
        llm = LLM(dtype="float32", tensor_parallel_size=size, kv_cache_memory=64 << 20, max_model_len=512)
        texts[size] = [out.outputs[0].token_ids for out in llm.generate(prompts, params)]
        del llm
    assert texts[3] == texts[1]
    with pytest.raises(InvalidRequestError, match="9 attention heads, which 2 ranks"):
        LLM(tensor_parallel_size=2)


@pytest.mark.parametrize("settings", [{"cuda_graph_sizes": [1, 2, 4]}, {"quantization": "fp8"}], ids=["graphs", "fp8"])
def test_the_graph_twin_and_fp8_run_per_rank(llama_checkpoint, settings):
    """Decode steps through the CUDA graphs' static-buffer twin (on a CPU, given sizes), and FP8
    weights quantized per rank from its slices (o and down with the scales of their whole rows,
    maxima combined across ranks), give the tokens of the same settings at one rank."""
    requests = mixed_requests(6, seed=2)
    outputs = {}
    for size in (1, 2):
        outputs[size] = run(tiny_llm(llama_checkpoint, tensor_parallel_size=size, **settings), requests)
    assert outputs[2] == outputs[1]
