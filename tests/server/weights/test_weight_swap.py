"""Weights that change under a running engine: an update gives exactly what a fresh engine on
the new checkpoint gives (eagerly and through the graphs' twin, with LoRA adapters still served
on top), a checkpoint that does not match is refused naming the tensor and changes nothing, the
prefix cache never serves blocks of the old weights, and sleep frees what it says and wakes up
to the same answers."""

from __future__ import annotations

import pytest
import torch

from argosy import LoRARequest, SamplingParams
from argosy.server.exceptions import CheckpointError, InvalidRequestError
from tests.adapters import make_adapter
from tests.checkpoints import build_checkpoint, tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
PROMPTS = [list(range(1, 40)), [5, 6, 7], [9, 8, 7, 6, 5]]


def answers(llm, lora=None) -> list[list[int]]:
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], GREEDY, lora_request=lora)
    return [o.outputs[0].token_ids for o in outputs]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The llama test checkpoint after 'training': the same tensors, other values."""
    return build_checkpoint(tmp_path_factory.mktemp("trained") / "llama", "llama", seed=7)


@pytest.mark.parametrize("graphs", [[], [1, 2, 4]], ids=["eager", "graph-twin"])
def test_an_update_gives_what_a_fresh_engine_on_the_new_checkpoint_gives(llama_checkpoint, trained, graphs):
    llm = tiny_llm(llama_checkpoint, cuda_graph_sizes=graphs, block_size=8)
    before = answers(llm)
    llm.update_weights(str(trained))
    after = answers(llm)
    assert after == answers(tiny_llm(trained, cuda_graph_sizes=graphs)) and after != before
    # The first prompt's blocks were cached with the old weights: none is served now.
    assert llm.generate([{"prompt_token_ids": PROMPTS[0]}], GREEDY)[0].num_cached_tokens > 0
    llm.update_weights(str(llama_checkpoint))
    assert llm.generate([{"prompt_token_ids": PROMPTS[0]}], GREEDY)[0].num_cached_tokens == 0
    assert answers(llm) == before


def test_adapters_stay_served_on_the_new_base_weights(llama_checkpoint, trained, tmp_path):
    folder = make_adapter(llama_checkpoint, tmp_path / "adapter", seed=2)
    lora = LoRARequest("tuned", 1, str(folder))
    llm = tiny_llm(llama_checkpoint, enable_lora=True)
    answers(llm, lora)
    llm.update_weights(str(trained))
    assert answers(llm, lora) == answers(tiny_llm(trained, enable_lora=True), lora)


@pytest.mark.parametrize(
    "change, words",
    [
        ({"intermediate_size": 96}, "mlp.gate_proj.weight' is F32 [96, 64], the running model's is F32 [128, 64]"),
        ({"num_hidden_layers": 3}, "'model.layers.2.input_layernorm.weight' is not in the running model"),
        ({"dtype": torch.bfloat16}, "is BF16"),
    ],
    ids=["shape", "extra-layer", "dtype"],
)
def test_a_checkpoint_that_does_not_match_is_refused_and_changes_nothing(llama_checkpoint, tmp_path, change, words):
    dtype = change.pop("dtype", None)
    other = build_checkpoint(tmp_path / "other", "llama", seed=3, **change)
    if dtype is not None:
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(other).to(dtype).save_pretrained(other)
    llm = tiny_llm(llama_checkpoint)
    before = answers(llm)
    with pytest.raises(CheckpointError, match=words.replace("[", r"\[").replace("]", r"\]")):
        llm.update_weights(str(other))
    assert answers(llm) == before


def test_a_checkpoint_with_a_corrupt_tensor_is_refused_before_anything_is_copied(llama_checkpoint, tmp_path):
    import shutil

    broken = shutil.copytree(llama_checkpoint, tmp_path / "broken")
    shard = next(broken.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) - 64]))  # the last tensor cut short
    llm = tiny_llm(llama_checkpoint)
    before = answers(llm)
    with pytest.raises(CheckpointError):
        llm.update_weights(str(broken))
    assert answers(llm) == before


@pytest.mark.parametrize("graphs", [[], [1, 2, 4]], ids=["eager", "graph-twin"])
def test_sleep_frees_the_cache_then_the_weights_and_wakes_up_to_the_same_answers(llama_checkpoint, graphs):
    llm = tiny_llm(llama_checkpoint, cuda_graph_sizes=graphs)
    runner = llm.engine.core.executor.worker.runner
    before = answers(llm)
    cache_bytes, weight_bytes = runner.kv_cache.nbytes, sum(t.nbytes for t in runner.model.state_dict().values())
    assert llm.sleep(1) == cache_bytes
    with pytest.raises(InvalidRequestError, match="level must be 1 or 2"):
        llm.sleep(3)
    llm.wake_up()
    assert answers(llm) == before
    assert llm.sleep(2) == cache_bytes + weight_bytes and runner.model is None
    with pytest.raises(InvalidRequestError, match="the engine is asleep"):
        answers(llm)
    llm.wake_up()
    assert answers(llm) == before


def test_an_update_while_asleep_loads_the_new_weights_for_the_wake_up(llama_checkpoint, trained):
    llm = tiny_llm(llama_checkpoint)
    llm.sleep(2)
    llm.update_weights(str(trained))
    llm.wake_up()
    assert answers(llm) == answers(tiny_llm(trained))
