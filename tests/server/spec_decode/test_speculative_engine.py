"""Speculative decoding through the whole engine: greedy requests keep exactly their tokens,
whatever the batching, chunking, caching, preemption or n; the drafts are really proposed,
kept and refused; and speculation turns itself off above its batch size.

The tiny random checkpoints' outputs hardly repeat, so prompt lookup would rarely propose a
draft they keep: these tests propose from an oracle instead, the plain run's own tokens with
every fourth one wrong, so that drafts are kept in part, refused in part, and kept whole."""

from __future__ import annotations

import json

import jsonschema
import pytest

from argosy import LLM, SamplingParams
from argosy.server.structured.params import StructuredOutputsParams
from tests.checkpoints import ARCHS, tiny_llm
from tests.server.models.test_greedy_identity import mixed_requests, run
from tests.server.structured.schema_corpus import SCHEMAS

NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
ALWAYS = NGRAM | {"disable_by_batch_size": 64}
BLOCK_BYTES = 2 * 2 * 16 * 2 * 16 * 4  # one block of the test checkpoints, float32
# Sixteen mixed requests preempt one another in a cache of 24 blocks of BLOCK_BYTES.
PREEMPTING = {"max_model_len": 384, "max_num_batched_tokens": 128}


def propose_from(llm, requests, outputs) -> None:
    """Drafts from the known outputs, every fourth token of them wrong (by position)."""
    speculator = llm.engine.core.speculator
    truths = {tuple(prompt): output for (prompt, _), output in zip(requests, outputs)}
    lookup = speculator.propose

    def propose(seq, budget):
        lookup(seq, budget)  # its bookkeeping; the draft is the oracle's
        truth, done = truths[tuple(seq.request.prompt_token_ids)], seq.num_output_tokens
        k = min(speculator.config.num_speculative_tokens, budget, len(truth) - done - 1)
        return [t + 1 if (done + j) % 4 == 3 else t for j, t in enumerate(truth[done : done + max(k, 0)])]

    speculator.propose = propose


def assert_drafts_were_kept_and_refused(llm) -> None:
    stats = llm.stats().spec_decode
    assert stats.num_drafts > 0
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.accepted_per_pos[0] >= stats.accepted_per_pos[-1] > 0
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_are_the_same_with_speculation_chunked_prefill_and_prefix_hits(checkpoints, arch):
    requests = mixed_requests(12, seed=3)
    expected = run(tiny_llm(checkpoints[arch], max_num_batched_tokens=64), requests)
    llm = tiny_llm(checkpoints[arch], max_num_batched_tokens=64, speculative_config=ALWAYS)
    propose_from(llm, requests, expected)
    assert run(llm, requests) == expected
    assert run(llm, requests) == expected  # again: every prompt now a prefix hit
    stats = llm.stats()
    assert stats.prefix_cache_hits > 0 and stats.kv_blocks_used == 0
    assert_drafts_were_kept_and_refused(llm)


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_tokens_are_the_same_with_speculation_under_preemption(checkpoints, arch):
    requests = mixed_requests(16, seed=4)
    expected = run(tiny_llm(checkpoints[arch]), requests)
    llm = tiny_llm(checkpoints[arch], kv_cache_memory=24 * BLOCK_BYTES, speculative_config=ALWAYS, **PREEMPTING)
    propose_from(llm, requests, expected)
    assert run(llm, requests) == expected
    stats = llm.stats()
    assert stats.num_preemptions > 0 and stats.kv_blocks_used == 0
    assert_drafts_were_kept_and_refused(llm)


def test_parallel_greedy_samples_are_each_the_plain_output(checkpoints):
    requests = [([7, 8, 9, 7, 8, 9, 7, 8], 40)]
    (expected,) = run(tiny_llm(checkpoints["qwen2"]), requests)
    llm = tiny_llm(checkpoints["qwen2"], speculative_config=ALWAYS)
    propose_from(llm, requests, [expected])
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, n=3)
    (out,) = llm.generate([{"prompt_token_ids": requests[0][0]}], params)
    assert [o.token_ids for o in out.outputs] == [expected] * 3
    assert_drafts_were_kept_and_refused(llm)


def test_speculation_is_off_while_more_sequences_run_than_its_batch_size(checkpoints):
    requests = mixed_requests(8, seed=5)
    expected = run(tiny_llm(checkpoints["llama"]), requests)
    llm = tiny_llm(checkpoints["llama"], speculative_config=NGRAM | {"disable_by_batch_size": 2})
    propose_from(llm, requests, expected)
    engine = llm.engine.core
    running_when_drafted = []
    propose = engine.speculator.propose

    def watched(seq, budget):
        running_when_drafted.append(len(engine.scheduler.running))
        return propose(seq, budget)

    engine.speculator.propose = watched
    assert run(llm, requests) == expected
    assert running_when_drafted and max(running_when_drafted) <= 2
    assert llm.stats().spec_decode.num_drafts > 0


def test_constrained_outputs_are_the_same_with_speculation(llama_checkpoint):
    # The oracle's wrong tokens are mostly ones the grammar refuses: drafts are cut there.
    prompts = [f"Answer in JSON ({i}):" for i in range(6)]
    params = [
        SamplingParams(temperature=0.0, max_tokens=120, structured_outputs=StructuredOutputsParams(json=schema))
        for schema in SCHEMAS[:6]
    ]
    settings = {"structured_outputs_max_whitespace": 2, "kv_cache_memory": 16 << 20}
    plain = tiny_llm(llama_checkpoint, **settings).generate(prompts, params)
    llm = tiny_llm(llama_checkpoint, speculative_config=ALWAYS, **settings)
    expected = [out.outputs[0].token_ids for out in plain]
    propose_from(llm, [(out.prompt_token_ids, None) for out in plain], expected)
    assert [out.outputs[0].token_ids for out in llm.generate(prompts, params)] == expected
    assert_drafts_were_kept_and_refused(llm)


def test_sampled_constrained_outputs_with_speculation_satisfy_their_schemas(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, speculative_config=ALWAYS, structured_outputs_max_whitespace=2)
    speculator = llm.engine.core.speculator
    lookup = speculator.propose
    speculator.propose = lambda seq, budget: (lookup(seq, budget) or seq.token_ids[-3:])[:budget]  # always one
    params = [
        SamplingParams(temperature=1.0, seed=i, max_tokens=300, structured_outputs=StructuredOutputsParams(json=schema))
        for i, schema in enumerate(SCHEMAS[:8])
    ]
    for schema, out in zip(SCHEMAS, llm.generate(["Answer in JSON:"] * 8, params)):
        assert out.outputs[0].finish_reason == "stop", out.outputs[0].text
        jsonschema.validate(json.loads(out.outputs[0].text), schema)
    assert llm.stats().spec_decode.num_drafts > 0


# bfloat16: one stream's verifications and its plain decodes share their arithmetic exactly (the
# paired linear kernel's rows and the chunk kernel's rows do not depend on the rows beside them)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prompt_lookup_on_the_default_model_keeps_most_drafts_of_a_repeating_answer(dtype):
    prompt = (
        "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
        "mango, nectarine. Again: apple, banana,"
    )
    params = SamplingParams(temperature=0.0, max_tokens=40)
    (plain,) = LLM(dtype=dtype).generate([prompt], params)
    llm = LLM(dtype=dtype, speculative_config=NGRAM | {"prompt_lookup_min": 2, "prompt_lookup_max": 4})
    (out,) = llm.generate([prompt], params)
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids
    stats = llm.stats().spec_decode
    assert stats.num_accepted_tokens > stats.num_draft_tokens / 2 and stats.num_drafts > 5
