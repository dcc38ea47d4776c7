"""Tensor parallelism composes with everything one rank serves: at 2 ranks (the 4-head test
model) the tokens of an adapter, of prompt lookup and of a draft model, and the tokens after a
weight update and after sleep and wake-up, each equal one rank's (greedy, float32); so do the
default model's at 3 ranks, with an adapter, with prompt lookup and after a weight update."""

from __future__ import annotations

from argosy import LLM, LoRARequest, SamplingParams
from argosy.server.models.default_model import resolve_model_path
from tests.adapters import make_adapter
from tests.checkpoints import build_checkpoint, tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
# Prompts that repeat themselves, so that prompt lookup finds drafts to verify.
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], list(range(20, 60)), [11, 12, 13] * 6, [40, 41]]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 3,
         "disable_by_batch_size": 64}  # fmt: skip


def tokens(llm: LLM, lora: LoRARequest | None = None, prompts=PROMPTS) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY, lora_request=lora)
    return [o.outputs[0].token_ids for o in outs]


def test_two_ranks_equal_one_with_an_adapter_prompt_lookup_a_weight_update_and_sleep(llama_checkpoint, tmp_path):
    adapter = LoRARequest("a", 1, str(make_adapter(llama_checkpoint, tmp_path / "a", seed=3)))
    update = build_checkpoint(tmp_path / "update", "llama", seed=7)  # the same tensors, other values
    runs = {}
    for size in (1, 2):
        llm = tiny_llm(
            llama_checkpoint, tensor_parallel_size=size, enable_lora=True, max_lora_rank=8, speculative_config=NGRAM
        )
        run = {"base": tokens(llm), "adapter": tokens(llm, adapter)}
        llm.update_weights(str(update))
        run["updated"], run["updated adapter"] = tokens(llm), tokens(llm, adapter)
        llm.sleep(2)
        llm.update_weights(str(llama_checkpoint))  # asleep without weights: loaded now, the cache at wake-up
        llm.wake_up()
        run["woken"] = tokens(llm)
        run["accepted"] = llm.stats().spec_decode.num_accepted_tokens > 0
        runs[size] = run
        del llm
    assert runs[2] == runs[1]
    one = runs[1]
    # Each figure tells something: the adapter, the update and prompt lookup all changed or did something.
    assert one["adapter"] != one["base"] and one["updated"] != one["base"] and one["accepted"]
    assert one["woken"] == one["base"]


def test_two_ranks_equal_one_with_a_draft_model(llama_checkpoint, tmp_path):
    draft = build_checkpoint(tmp_path / "draft", "llama", seed=1)
    config = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 3}
    runs = {}
    for size in (1, 2):
        llm = tiny_llm(llama_checkpoint, tensor_parallel_size=size, speculative_config=config)
        runs[size] = (tokens(llm), llm.stats().spec_decode.num_draft_tokens)
        del llm
    assert runs[2] == runs[1] and runs[1][1] > 0


def test_the_default_model_at_three_ranks_equals_one_with_an_adapter_prompt_lookup_and_a_weight_update(tmp_path):
    prompts = [[504, 3458, 282, 4649, 314, 504, 3458, 282], [19, 20, 21, 22] * 4]
    base = resolve_model_path(None)
    adapter = LoRARequest("a", 1, str(make_adapter(base, tmp_path / "a", seed=5)))
    runs = {}
    for size in (1, 3):
        llm = LLM(dtype="float32", tensor_parallel_size=size, kv_cache_memory=64 << 20, max_model_len=256,
                  speculative_config=NGRAM, enable_lora=True, max_lora_rank=8)  # fmt: skip
        before = tokens(llm, prompts=prompts), tokens(llm, adapter, prompts=prompts)
        llm.update_weights(str(base))  # every rank reads its slices again
        runs[size] = (before, tokens(llm, prompts=prompts))
        del llm
    assert runs[3] == runs[1]
    (plain, adapted), updated = runs[1]
    assert adapted != plain and updated == plain
