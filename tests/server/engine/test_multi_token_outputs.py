"""A step may keep fewer tokens than it computed and return several new tokens per sequence (what
speculative decoding needs): the scheduler advances by what was kept, the KV-cache manager gives
back the slots past it, blocks holding tokens not kept never enter the prefix cache, and the
core and the API process take a list of new tokens per sequence, ending it at the first stop."""

from __future__ import annotations

import time

from argosy.server.engine.core_protocol import EngineCoreOutput, EngineCoreRequest
from argosy.server.engine.input_processor import NewRequest
from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.executor.plan import StepResult
from argosy.server.sampling_params import SamplingParams
from tests.checkpoints import tiny_llm

BLOCK = 4


def running(scheduler: Scheduler, tokens: list[int]) -> Sequence:
    seq = Sequence(0, Request("r", tokens, SamplingParams()), 0, tokens)
    scheduler.add(seq)
    return seq


def test_advance_keeps_what_was_kept_and_gives_back_the_rest():
    kv = KVCacheManager(16, BLOCK, enable_prefix_caching=True)
    scheduler = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, enable_chunked_prefill=True)
    seq = running(scheduler, list(range(10, 20)))  # 10 tokens: 3 blocks
    scheduler.advance(scheduler.schedule())
    assert seq.num_computed_tokens == 10 and len(seq.block_table) == 3
    seq.block_table_changed_from = None
    # Six more tokens computed (say, one and five drafts), of which two are kept.
    seq.token_ids += [1, 2, 3, 4, 5, 6]
    out = scheduler.schedule()
    assert out.scheduled[0].num_new_tokens == 6 and len(seq.block_table) == 4
    used = kv.num_used_blocks
    scheduler.advance(out, kept=[2])
    assert seq.num_computed_tokens == 12 and len(seq.block_table) == 3  # 12 tokens fill 3 blocks
    assert kv.num_used_blocks == used - 1 and seq.block_table_changed_from == 3
    # Three full blocks of kept tokens are cached; nothing of the tokens not kept is.
    del seq.token_ids[12:]
    hashes = [kv.pool.blocks[b].block_hash for b in seq.block_table]
    assert all(h is not None for h in hashes) and len(kv.pool._cached) == 3


def test_blocks_of_computed_tokens_that_are_not_the_sequences_are_never_cached():
    kv = KVCacheManager(16, BLOCK, enable_prefix_caching=True)
    seq = Sequence(0, Request("r", [1, 2, 3, 4, 5, 6], SamplingParams()), 0, [1, 2, 3, 4, 5, 6])
    assert kv.allocate(seq, 8)
    seq.num_computed_tokens = 8  # two blocks computed, but the second holds tokens not kept
    kv.cache_full_blocks(seq)
    assert kv.pool.blocks[seq.block_table[0]].block_hash is not None
    assert kv.pool.blocks[seq.block_table[1]].block_hash is None


def test_the_core_keeps_new_tokens_up_to_the_first_stop(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint)
    core = llm.engine.core
    eos = min(core.eos_token_ids)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    core.add_request(EngineCoreRequest("r", [5, 6, 7], params, time.monotonic()))
    (seq,) = core.requests["r"].seqs
    core.step()  # the prompt, and its first token
    first = seq.output_token_ids
    assert len(first) == 1
    (out,) = core._append_sampled([seq], StepResult([[11, 12, eos, 13]], [None], [None]))
    assert out.new_token_ids == [11, 12, eos] and out.finish_reason == "stop"
    assert seq.output_token_ids == [*first, 11, 12, eos] and "r" not in core.requests


def test_the_api_side_takes_several_tokens_and_ends_at_a_stop_string(llama_checkpoint):
    from argosy.server.text.tokenizer import Tokenizer

    tokenizer = Tokenizer(llama_checkpoint)
    processor = OutputProcessor(tokenizer)
    params = SamplingParams(max_tokens=20, stop=" two")
    processor.add(NewRequest(EngineCoreRequest("r", [5, 6], params, time.monotonic()), None))
    ids = tokenizer.encode(" one two three four", add_special_tokens=False)
    results, stopped = processor.process([EngineCoreOutput("r", 0, ids)], 0.0)
    (result,) = results
    assert result.finished and result.outputs[0].text == " one" and result.outputs[0].stop_reason == " two"
    assert stopped == [("r", 0)]  # the core still runs it: told to stop
