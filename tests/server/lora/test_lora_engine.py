"""Adapters served by the offline engine: greedy tokens equal to transformers running PEFT's
merged weights, on every architecture; a step mixing adapters and the base gives each request
what it gets alone, eagerly and through the CUDA graphs' twin; more adapters than slots all
finish, none mixed; KV blocks are shared only between requests with the same weights; and every
slot and host reference goes back, however requests end."""

from __future__ import annotations

import pytest

from argosy import LoRARequest, SamplingParams
from argosy.server.exceptions import InvalidRequestError
from tests.adapters import ALL_MODULES, make_adapter, merged_reference, peft_model
from tests.checkpoints import ARCHS, reference_greedy, tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
PROMPTS = [[1, 5, 9, 22, 31, 7, 8], [3, 3, 40, 2], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [9, 8], [4, 44, 4]]


@pytest.fixture(scope="module")
def adapters(llama_checkpoint, tmp_path_factory) -> list[LoRARequest]:
    """Four adapters of the llama checkpoint: different seeds, ranks and modules."""
    root = tmp_path_factory.mktemp("adapters")
    kinds = [(ALL_MODULES, 4), (["q_proj", "v_proj"], 8), (["gate_proj", "down_proj", "o_proj"], 2), (ALL_MODULES, 16)]
    return [
        LoRARequest(f"a{i}", i + 1, str(make_adapter(llama_checkpoint, root / f"a{i}", targets, rank=rank, seed=i)))
        for i, (targets, rank) in enumerate(kinds)
    ]


def tokens(outputs) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in outputs]


def alone(llm, prompt: list[int], lora: LoRARequest | None) -> list[int]:
    return tokens(llm.generate([{"prompt_token_ids": prompt}], GREEDY, lora_request=lora))[0]


def reference(base, prompt: list[int], lora: LoRARequest | None) -> list[int]:
    """transformers' greedy tokens with PEFT's merged weights."""
    return reference_greedy(merged_reference(base, lora and lora.lora_path), prompt, GREEDY.max_tokens)


def held(llm) -> tuple[list[int], dict]:
    """Every slot's holders, and the host cache's."""
    core = llm.engine.core
    return core.lora.slots.holders, core.lora.host.holders


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("targets, rslora", [(ALL_MODULES, False), (["k_proj", "up_proj", "o_proj"], True)])
def test_greedy_tokens_equal_transformers_on_pefts_merged_weights(checkpoints, tmp_path, arch, targets, rslora):
    base = checkpoints[arch]
    folder = make_adapter(base, tmp_path / "adapter", targets, rank=8, alpha=16, seed=3, use_rslora=rslora)
    merged = peft_model(base, targets, rank=8, alpha=16, seed=3, use_rslora=rslora).merge_and_unload().eval()
    llm = tiny_llm(base, enable_lora=True, max_lora_rank=8)
    lora = LoRARequest("tuned", 1, str(folder))
    got = tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, lora_request=lora))
    assert got == [reference_greedy(merged, p, GREEDY.max_tokens) for p in PROMPTS]
    base_tokens = alone(llm, PROMPTS[0], None)
    assert base_tokens != got[0]  # the adapter changes the answer: the comparison can fail


@pytest.mark.parametrize(
    "settings",
    [{}, {"cuda_graph_sizes": [1, 2, 4, 8]}, {"cuda_graph_sizes": [1, 2, 4, 8], "attention_backend": "triton"}],
    ids=["eager", "graph-twin", "triton-graph-twin"],
)
def test_a_step_mixing_four_adapters_and_the_base_gives_each_request_its_own_tokens(
    llama_checkpoint, adapters, settings
):
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=4, **settings)
    loras = [*adapters, None]
    expected = [reference(llama_checkpoint, p, lora) for p, lora in zip(PROMPTS, loras)]
    assert [alone(llm, p, lora) for p, lora in zip(PROMPTS, loras)] == expected
    # Interleaved so that neither the scheduler nor the batch keeps an adapter's sequences together.
    order = [4, 0, 2, 1, 3]
    mixed = llm.generate([{"prompt_token_ids": PROMPTS[i]} for i in order], GREEDY, [loras[i] for i in order])
    assert tokens(mixed) == [expected[i] for i in order]
    assert held(llm) == ([0, 0, 0, 0], {})


def test_more_adapters_than_slots_all_finish_none_mixed(llama_checkpoint, adapters):
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=2)
    expected = [reference(llama_checkpoint, PROMPTS[i], lora) for i, lora in enumerate(adapters)]
    running_adapters = []
    scheduler = llm.engine.core.scheduler
    schedule = scheduler.schedule

    def watched():
        out = schedule()
        running_adapters.append({s.request.lora.digest for s in scheduler.running if s.request.lora is not None})
        return out

    scheduler.schedule = watched
    both = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], GREEDY, lora_request=list(adapters))
    assert tokens(both) == expected
    assert max(len(digests) for digests in running_adapters) == 2  # never more than the slots
    assert held(llm) == ([0, 0], {})


def test_kv_blocks_are_shared_only_between_requests_with_the_same_weights(llama_checkpoint, adapters, tmp_path):
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=2, block_size=4)
    prompt = list(range(1, 30))

    def cached(lora):
        return llm.generate([{"prompt_token_ids": prompt}], GREEDY, lora_request=lora)[0].num_cached_tokens

    assert cached(adapters[0]) == 0
    assert cached(adapters[0]) == 28  # the same weights: every full block of the prompt
    assert cached(adapters[1]) == 0  # another adapter never reads them
    assert cached(None) == 0  # nor does the base model
    # The same name, other weights: a reload is never served from the old adapter's blocks.
    other = make_adapter(llama_checkpoint, tmp_path / "other", seed=9)
    renamed = LoRARequest(adapters[0].lora_name, 99, str(other))
    assert cached(renamed) == 0
    assert alone(llm, prompt, renamed) == reference(llama_checkpoint, prompt, renamed)


def test_aborts_and_parallel_samples_give_every_reference_back(llama_checkpoint, adapters):
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=2)
    engine = llm.engine
    params = SamplingParams(temperature=1.0, n=3, max_tokens=6, seed=1)
    llm.generate([{"prompt_token_ids": PROMPTS[0]}] * 2, params, lora_request=adapters[:2])
    assert held(llm) == ([0, 0], {})
    for i, lora in enumerate(adapters[:3]):
        engine.add_request(f"r{i}", PROMPTS[i], SamplingParams(max_tokens=50, n=2), lora_request=lora)
    engine.step()
    engine.step()
    assert sum(held(llm)[0]) == 2  # two admitted, the third waits for a slot
    for i in range(3):
        engine.abort(f"r{i}")
    assert held(llm) == ([0, 0], {})
    assert not engine.core.scheduler.waiting and not engine.core.scheduler.running


def test_lora_on_but_unused_gives_the_base_models_tokens_and_runs_no_lora_op(llama_checkpoint, monkeypatch):
    plain = tokens(tiny_llm(llama_checkpoint).generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY))
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=2)
    calls = []
    runner = llm.engine.core.executor.worker.runner
    for layer in runner.model.modules():
        if type(layer).__name__ == "LoRALayer":
            monkeypatch.setattr(layer, "op", lambda *args: calls.append(args))
    assert tokens(llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY)) == plain
    assert calls == []


def test_adapter_requests_are_refused_with_lora_off_or_a_bad_folder(llama_checkpoint, adapters, tmp_path):
    with pytest.raises(InvalidRequestError, match="LoRA is off"):
        tiny_llm(llama_checkpoint).generate("hi", GREEDY, lora_request=adapters[0])
    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_lora_rank=8)
    with pytest.raises(InvalidRequestError, match="above the server's max_lora_rank 8"):
        llm.generate("hi", GREEDY, lora_request=adapters[3])  # rank 16
    with pytest.raises(InvalidRequestError, match="adapter folder not found"):
        llm.generate("hi", GREEDY, lora_request=LoRARequest("gone", 5, str(tmp_path / "nothing")))
    assert held(llm) == ([0], {})


def test_a_failed_step_leaves_no_slot_claiming_an_adapter_it_may_not_hold(llama_checkpoint, adapters, monkeypatch):
    from argosy.server.engine.core_protocol import EngineCoreRequest
    from argosy.server.engine.request_options import RequestOptions

    llm = tiny_llm(llama_checkpoint, enable_lora=True, max_loras=1)
    core = llm.engine.core
    ref = llm.engine.adapter_for(adapters[0])
    core.add_request(EngineCoreRequest("r", PROMPTS[0], GREEDY, 0.0, RequestOptions(ref)))

    def broken(plan):
        raise RuntimeError("the device failed")

    monkeypatch.setattr(core.executor, "execute", broken)
    with pytest.raises(RuntimeError, match="the device failed"):
        core.step()
    assert core.lora.slots.refs == [None]  # the next request for it loads it again
    monkeypatch.undo()
    core.abort("r")
    assert alone(llm, PROMPTS[0], adapters[0]) == reference(llama_checkpoint, PROMPTS[0], adapters[0])


def test_a_name_moved_back_to_its_first_weights_is_served_again(llama_checkpoint, adapters):
    llm = tiny_llm(llama_checkpoint, enable_lora=True)
    first, second = adapters[0], adapters[1]
    for folder in (first, second, first):
        lora = LoRARequest("moving", 1, folder.lora_path)
        assert alone(llm, PROMPTS[1], lora) == reference(llama_checkpoint, PROMPTS[1], folder)
    slots = llm.engine.core.lora.slots
    assert not slots.is_retired(llm.engine.adapters.get("moving").digest)
    assert [ref.name for ref in slots.refs] == ["moving"]  # still in its slot, idle
