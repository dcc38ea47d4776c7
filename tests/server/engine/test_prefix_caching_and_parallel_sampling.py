"""Prefix caching across requests, and n > 1 sampling sharing one copy of the prompt."""

from __future__ import annotations

from argosy import SamplingParams
from tests.checkpoints import tiny_llm

PROMPT = list(range(3, 43))  # 40 tokens: two full blocks of 16 and one partial block


def test_repeated_prompt_hits_the_cache_and_gives_the_same_output(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    before = llm.stats()
    second = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    after = llm.stats()
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(PROMPT)
    assert after.prefix_cache_hits - before.prefix_cache_hits == 32
    assert second.num_cached_tokens == 32 and first.num_cached_tokens == 0
    assert second.outputs[0].token_ids == first.outputs[0].token_ids


def test_reset_prefix_cache_forgets_the_blocks_but_not_while_requests_run(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    first = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    llm.engine.add_request("running", PROMPT, params)
    llm.engine.step()
    assert llm.reset_prefix_cache() is False  # blocks in use: nothing changes
    llm.engine.abort("running")
    assert llm.reset_prefix_cache() is True
    again = llm.generate({"prompt_token_ids": PROMPT}, params)[0]
    assert again.num_cached_tokens == 0 and again.outputs[0].token_ids == first.outputs[0].token_ids


def test_prefix_caching_off_never_hits(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, enable_prefix_caching=False)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    llm.generate([{"prompt_token_ids": PROMPT}] * 2, params)
    assert llm.stats().prefix_cache_hits == 0


def test_n8_stores_the_prompt_once_and_copies_the_shared_block_on_write(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    engine = llm.engine
    engine.add_request("r", PROMPT, SamplingParams(n=8, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True))
    outputs = []
    while not outputs:
        outputs = engine.step()
    assert len(outputs[0].outputs) == 8
    assert engine.stats().kv_blocks_used == 3  # 8 sequences, one copy of the prompt's 3 blocks
    engine.step()
    # Each sequence wrote into the shared partial block: 7 copies, the last writer keeps the original.
    assert engine.stats().kv_blocks_used == 2 + 8
    while engine.has_unfinished_requests():
        outputs = engine.step()
    texts = {tuple(o.token_ids) for o in outputs[0].outputs}
    assert len(texts) > 1 and all(len(o.token_ids) == 6 for o in outputs[0].outputs)
    assert engine.stats().kv_blocks_used == 0


def test_forks_never_push_the_batch_past_max_num_seqs(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, max_num_seqs=4, max_num_batched_tokens=16)
    engine = llm.engine
    for i in range(3):
        engine.add_request(str(i), PROMPT, SamplingParams(n=3, max_tokens=5, ignore_eos=True))
    finished = []
    while engine.has_unfinished_requests():
        finished += [o for o in engine.step() if o.finished]
        assert len(engine.core.scheduler.running) <= 4
    assert sorted(len(o.outputs) for o in finished) == [3, 3, 3]


def test_greedy_n8_children_all_equal_the_single_greedy_output(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    single = llm.generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    )[0]
    many = llm.generate(
        {"prompt_token_ids": PROMPT}, SamplingParams(n=8, temperature=0.0, max_tokens=20, ignore_eos=True)
    )[0]
    assert [o.index for o in many.outputs] == list(range(8))
    assert all(o.token_ids == single.outputs[0].token_ids for o in many.outputs)
