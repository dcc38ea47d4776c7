"""The host tier in the engine, on a real checkpoint: greedy outputs equal transformers' with the
tier on under forced preemption and eviction (n > 1 too), a returning prompt finds its evicted
blocks there, an abort while its blocks load returns them, and the settings it refuses."""

from __future__ import annotations

import pytest

from argosy import SamplingParams
from argosy.server.engine_config import EngineConfig
from argosy.server.exceptions import InvalidRequestError
from tests.checkpoints import ARCHS, load_reference, reference_greedy, tiny_llm
from tests.server.models.test_greedy_identity import mixed_requests, run

BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # the test checkpoints' block: 2 layers, K and V, 16 tokens, 2 x 16, fp32
GIB = 1 << 30
DRAFT_MODEL = '{"method": "draft_model", "model": "/m", "num_speculative_tokens": 2}'


def tiered_llm(path, device_blocks: int, host_blocks: int, **kwargs):
    return tiny_llm(
        path,
        kv_cache_memory=device_blocks * BLOCK_BYTES,
        swap_space=host_blocks * BLOCK_BYTES / GIB,
        max_model_len=384,
        **kwargs,
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_preemption_with_the_tier_keeps_outputs_identical_and_recomputes_at_most_a_block(checkpoints, arch):
    requests = mixed_requests(32, seed=1)
    model = load_reference(checkpoints[arch])
    expected = [reference_greedy(model, p, n) for p, n in requests]
    llm = tiered_llm(checkpoints[arch], 24, 256, max_num_batched_tokens=128)
    assert run(llm, requests) == expected
    core = llm.engine.core
    scheduler, host = core.scheduler, core.kv.connector.stats()
    assert scheduler.num_preemptions > 0 and host.blocks_loaded > 0
    assert scheduler.recomputed_tokens <= scheduler.num_preemptions * 16
    assert llm.stats().kv_blocks_used == 0 and host.blocks_used <= host.blocks_total == 256


def test_parallel_samples_under_preemption_with_the_tier_equal_the_reference(llama_checkpoint):
    prompts = [[(11 * i + 7 * j) % 290 + 3 for j in range(40 + 9 * i)] for i in range(6)]
    model = load_reference(llama_checkpoint)
    llm = tiered_llm(llama_checkpoint, 24, 128, max_num_batched_tokens=64)
    params = SamplingParams(n=3, temperature=0.0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for prompt, out in zip(prompts, outputs):
        expected = reference_greedy(model, prompt, 24)
        assert [o.token_ids for o in out.outputs] == [expected] * 3
    assert llm.stats().num_preemptions > 0 and llm.stats().kv_blocks_used == 0


def evict_with_other_prompts(llm, count: int = 12) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([{"prompt_token_ids": [(13 * i + j) % 290 + 3 for j in range(60)]} for i in range(count)], params)


CONVERSATION = [(5 * j) % 290 + 3 for j in range(100)]  # 6 full blocks and a partial one


def test_a_returning_prompt_finds_its_evicted_blocks_in_the_tier(llama_checkpoint):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outcomes = {}
    for host_blocks in (0, 64):
        llm = tiered_llm(llama_checkpoint, 30, host_blocks)
        first = llm.generate({"prompt_token_ids": CONVERSATION}, params)[0]
        evict_with_other_prompts(llm)
        again = llm.generate({"prompt_token_ids": CONVERSATION}, params)[0]
        assert again.outputs[0].token_ids == first.outputs[0].token_ids
        outcomes[host_blocks] = again.num_cached_tokens
        if host_blocks:
            host = llm.engine.core.kv.connector.stats()
            assert host.hit_tokens == 96 and host.blocks_loaded == 6
    assert outcomes == {0: 0, 64: 96}


def test_an_abort_while_blocks_load_returns_them(llama_checkpoint):
    llm = tiered_llm(llama_checkpoint, 30, 64)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": CONVERSATION}, params)[0]
    evict_with_other_prompts(llm)
    engine = llm.engine
    engine.add_request("loading", CONVERSATION, params)
    assert engine.step() == []  # the step only loads its blocks
    core = engine.core
    assert core.kv.connector.stats().blocks_loaded == 6 and core.num_requests() == (0, 1)
    engine.abort("loading")
    assert llm.stats().kv_blocks_used == 0
    again = llm.generate({"prompt_token_ids": CONVERSATION}, params)[0]
    assert again.outputs[0].token_ids == first.outputs[0].token_ids and again.num_cached_tokens == 96


def test_resetting_the_prefix_cache_empties_the_tier_too(llama_checkpoint):
    llm = tiered_llm(llama_checkpoint, 30, 64)
    llm.generate({"prompt_token_ids": CONVERSATION}, SamplingParams(max_tokens=2))
    evict_with_other_prompts(llm)
    assert len(llm.engine.core.kv.connector.pool) > 0
    assert llm.reset_prefix_cache() is True and len(llm.engine.core.kv.connector.pool) == 0


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"swap_space": -1}, "0 or more"),
        ({"swap_space": "4"}, "number of GiB"),
        ({"swap_space": 1, "enable_prefix_caching": False}, "needs prefix caching"),
        ({"swap_space": 1, "speculative_config": DRAFT_MODEL}, "draft model"),
    ],
)
def test_settings_the_tier_refuses_name_the_field(settings, message):
    with pytest.raises(InvalidRequestError, match=message) as caught:
        EngineConfig(**settings)
    assert caught.value.param == "swap_space"
