"""Greedy decoding through the paged, continuously batched engine gives token for token
what transformers gives, whatever the batching, chunking, caching or preemption."""

from __future__ import annotations

import random

import pytest
import torch

from argosy import LLM, SamplingParams
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.step_inputs import SequenceChunk
from tests.checkpoints import ARCHS, load_reference, reference_greedy, tiny_llm


def mixed_requests(count: int, seed: int, vocab: int = 300) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    requests = []
    for i in range(count):
        length = rng.choice([1, 3, 15, 16, 17, 33, 70, 130])
        # Every third prompt starts with a common prefix, so prefix caching has work to do.
        prompt = (shared[:length] if i % 3 == 0 else []) + [rng.randrange(3, vocab) for _ in range(length)]
        requests.append((prompt, rng.choice([1, 2, 9, 16, 25])))
    return requests


@pytest.fixture(scope="module")
def references(checkpoints):
    """Expected greedy outputs per architecture for the 32 mixed requests."""
    result = {}
    for arch in ARCHS:
        model = load_reference(checkpoints[arch])
        result[arch] = [reference_greedy(model, p, n) for p, n in mixed_requests(32, seed=1)]
    return result


def run(llm: LLM, requests) -> list[list[int]]:
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    outputs = llm.generate([{"prompt_token_ids": p} for p, _ in requests], params)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("arch", ARCHS)
def test_single_request_matches_transformers(checkpoints, arch):
    prompt = [5, 17, 99, 23, 42, 7, 8, 250, 31]
    expected = reference_greedy(load_reference(checkpoints[arch]), prompt, 40)
    assert run(tiny_llm(checkpoints[arch]), [(prompt, 40)]) == [expected]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "whole-prefill"])
@pytest.mark.parametrize("prefix_caching", [True, False], ids=["prefix-cache", "no-prefix-cache"])
def test_32_concurrent_requests_match_transformers(checkpoints, references, arch, chunked, prefix_caching):
    llm = tiny_llm(
        checkpoints[arch],
        enable_chunked_prefill=chunked,
        enable_prefix_caching=prefix_caching,
        max_num_batched_tokens=64 if chunked else 512,
    )
    requests = mixed_requests(32, seed=1)
    assert run(llm, requests) == references[arch]
    stats = llm.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    if prefix_caching:
        assert stats.prefix_cache_hits > 0
    else:
        assert stats.prefix_cache_hits == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_preemption_keeps_outputs_identical(checkpoints, references, arch):
    # 24 blocks of 16 tokens cannot hold 32 requests of up to 285 tokens at once.
    block_bytes = 2 * 2 * 16 * 2 * 16 * 4
    llm = tiny_llm(checkpoints[arch], kv_cache_memory=24 * block_bytes, max_model_len=384, max_num_batched_tokens=128)
    assert llm.stats().kv_blocks_total == 24
    requests = mixed_requests(32, seed=1)
    assert run(llm, requests) == references[arch]
    stats = llm.stats()
    assert stats.num_preemptions > 0
    assert stats.kv_blocks_used == 0
    # A recomputed sequence finding its own old blocks is not counted as a cache query again.
    assert stats.prefix_cache_queries == sum(len(p) for p, _ in requests)


def test_prompt_longer_than_the_step_budget_is_prefilled_in_chunks_alone(checkpoints):
    prompt = list(range(3, 103))
    expected = reference_greedy(load_reference(checkpoints["qwen3"]), prompt, 5)
    assert run(tiny_llm(checkpoints["qwen3"], max_num_batched_tokens=16), [(prompt, 5)]) == [expected]


def test_first_step_logits_match_transformers(checkpoints):
    for arch in ARCHS:
        llm = tiny_llm(checkpoints[arch])
        prompts = [[5, 6, 7, 8, 9, 10, 11], [200, 3], list(range(3, 40))]
        for i, p in enumerate(prompts):
            llm.engine.add_request(str(i), p, SamplingParams(max_tokens=1))
        sched = llm.engine.core.scheduler.schedule()
        runner = llm.engine.core.executor.worker.runner
        tables = BlockTables.of([item.seq.block_table for item in sched.scheduled], runner.device)
        chunks = [
            SequenceChunk(item.seq.token_ids, 0, item.seq.block_table, item.completes, row)
            for row, item in enumerate(sched.scheduled)
        ]
        logits = runner.execute(chunks, sched.blocks_to_copy, tables)
        model = load_reference(checkpoints[arch])
        with torch.inference_mode():
            expected = torch.stack([model(torch.tensor([p])).logits[0, -1] for p in prompts])
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


LONG_PROMPT = [(7 * i) % 290 + 3 for i in range(150)]  # positions well past the original context


@pytest.mark.parametrize(
    "name, arch, overrides",
    [
        (
            "llama3-rope",
            "llama",
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "rope_theta": 10000.0,
                    "factor": 4.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                }
            },
        ),
        ("linear-rope", "llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}),
        ("tied-embeddings", "qwen2", {"tie_word_embeddings": True}),
        ("mistral", "mistral", {"sliding_window": None}),
    ],
)
def test_architecture_variants_match_transformers(tmp_path, name, arch, overrides):
    from tests.checkpoints import build_checkpoint

    path = build_checkpoint(tmp_path / name, arch, **overrides)
    expected = reference_greedy(load_reference(path), LONG_PROMPT, 20)
    assert run(tiny_llm(path), [(LONG_PROMPT, 20)]) == [expected]


def test_sharded_checkpoint_with_index_loads(tmp_path):
    from tests.checkpoints import build_checkpoint

    path = build_checkpoint(tmp_path / "sharded", "qwen3", max_shard_size="40KB")
    assert len(list(path.glob("*.safetensors"))) > 3 and (path / "model.safetensors.index.json").is_file()
    expected = reference_greedy(load_reference(path), LONG_PROMPT, 10)
    assert run(tiny_llm(path), [(LONG_PROMPT, 10)]) == [expected]


def test_mistral_sliding_window_caps_the_context(tmp_path):
    from tests.checkpoints import build_checkpoint

    path = build_checkpoint(tmp_path / "mistral-sw", "mistral", sliding_window=256)
    assert tiny_llm(path).engine.core.limits.max_model_len == 256
    with pytest.raises(Exception, match="sliding_window"):
        tiny_llm(path, max_model_len=400)
