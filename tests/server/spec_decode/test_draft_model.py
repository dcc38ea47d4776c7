"""Draft-model speculation through the whole engine. A draft that is another random checkpoint
proposes tokens the target mostly refuses: greedy outputs must not change. A draft that is the
target itself proposes the target's own greedy tokens, if its cache really holds what the
target's holds (through chunked prefill, prefix hits, preemption and refused drafts): nearly all
of them must be kept."""

from __future__ import annotations

import pytest

from argosy import SamplingParams
from argosy.server.exceptions import InvalidRequestError
from tests.checkpoints import ARCHS, build_checkpoint, tiny_llm
from tests.server.models.test_greedy_identity import mixed_requests, run
from tests.server.spec_decode.test_speculative_engine import BLOCK_BYTES, PREEMPTING

K = 3


def draft_config(path) -> dict:
    return {"method": "draft_model", "model": str(path), "num_speculative_tokens": K, "disable_by_batch_size": 64}


@pytest.fixture(scope="module")
def other_drafts(tmp_path_factory) -> dict:
    """Per architecture, a one-layer random checkpoint with the test checkpoints' vocabulary."""
    root = tmp_path_factory.mktemp("drafts")
    return {arch: build_checkpoint(root / arch, arch, seed=7, num_hidden_layers=1) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_are_the_same_with_a_draft_model_chunked_prefill_and_prefix_hits(checkpoints, other_drafts, arch):
    requests = mixed_requests(12, seed=3)
    expected = run(tiny_llm(checkpoints[arch], max_num_batched_tokens=64), requests)
    llm = tiny_llm(checkpoints[arch], max_num_batched_tokens=64, speculative_config=draft_config(other_drafts[arch]))
    assert run(llm, requests) == expected
    assert run(llm, requests) == expected  # again: every prompt now a prefix hit
    stats = llm.stats()
    assert stats.prefix_cache_hits > 0 and stats.kv_blocks_used == 0
    assert stats.spec_decode.num_drafts > 0


def kept_fraction(llm) -> float:
    stats = llm.stats().spec_decode
    assert stats.num_draft_tokens >= 50
    return stats.num_accepted_tokens / stats.num_draft_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_the_target_as_its_own_draft_has_its_drafts_kept_through_prefix_hits_and_preemption(checkpoints, arch):
    requests = mixed_requests(16, seed=4)
    expected = run(tiny_llm(checkpoints[arch]), requests)
    config = draft_config(checkpoints[arch])
    # Both caches in one budget: 24 blocks.
    llm = tiny_llm(checkpoints[arch], kv_cache_memory=2 * 24 * BLOCK_BYTES, speculative_config=config, **PREEMPTING)
    assert run(llm, requests) == expected
    assert run(llm, requests[::2]) == expected[::2]  # prefix hits: the draft's cache must hold them too
    stats = llm.stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0 and stats.kv_blocks_used == 0
    # The same weights propose the same argmax; float32 rounding between a one-token and a
    # several-token pass may flip a near tie now and then, never a tenth of them.
    assert kept_fraction(llm) > 0.9


def test_parallel_greedy_samples_with_a_draft_model_are_each_the_plain_output(checkpoints):
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    (expected,) = run(tiny_llm(checkpoints["qwen2"]), [(prompt, 40)])
    llm = tiny_llm(checkpoints["qwen2"], speculative_config=draft_config(checkpoints["qwen2"]))
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, n=3)
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params)
    assert [o.token_ids for o in out.outputs] == [expected] * 3
    assert kept_fraction(llm) > 0.9


def test_a_draft_asleep_and_awake_again_proposes_as_before(checkpoints):
    requests = mixed_requests(6, seed=5)
    llm = tiny_llm(checkpoints["llama"], speculative_config=draft_config(checkpoints["llama"]))
    expected = run(llm, requests)
    llm.sleep(level=2)
    llm.wake_up()
    assert run(llm, requests) == expected
    assert kept_fraction(llm) > 0.9


def test_a_draft_model_that_cannot_serve_is_refused_naming_the_field(checkpoints, tmp_path):
    other_vocab = build_checkpoint(tmp_path / "other", "llama", vocab_size=400)
    for path, words in ((other_vocab, "vocabulary of 400 tokens"), (tmp_path / "missing", "cannot be served")):
        with pytest.raises(InvalidRequestError, match=words) as caught:
            tiny_llm(checkpoints["llama"], speculative_config=draft_config(path))
        assert caught.value.param == "speculative_config.model"
