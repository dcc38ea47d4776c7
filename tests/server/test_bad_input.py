"""Bad input raises a specific exception naming the value, and leaves nothing allocated."""

from __future__ import annotations

import json
import shutil

import pytest

from argosy import LLM, SamplingParams
from argosy.server.exceptions import CheckpointError, InvalidRequestError, UnsupportedModelError
from tests.checkpoints import tiny_llm


@pytest.fixture(scope="module")
def llm(llama_checkpoint) -> LLM:
    return tiny_llm(llama_checkpoint, max_model_len=64)


@pytest.mark.parametrize(
    "prompt, params, param, words",
    [
        ({"prompt_token_ids": list(range(3, 67))}, SamplingParams(), "prompt", "64 tokens"),
        ({"prompt_token_ids": list(range(3, 40))}, SamplingParams(max_tokens=30), "max_tokens", "30"),
        ("", SamplingParams(), "prompt", "empty"),
        ({"prompt_token_ids": []}, SamplingParams(), "prompt", "empty"),
        ({"prompt_token_ids": [5, 10**6]}, SamplingParams(), "prompt", "1000000"),
        ({"prompt_token_ids": [5, -1]}, SamplingParams(), "prompt", "-1"),
        ("hi", SamplingParams(n=300), "n", "300"),
        ("hi", SamplingParams(min_tokens=2, stop_token_ids=[10**6]), "stop_token_ids", "1000000"),
        ({"text": "hi"}, SamplingParams(), "prompt", "prompt_token_ids"),
    ],
)
def test_bad_requests_raise_and_leave_nothing_behind(llm, prompt, params, param, words):
    with pytest.raises(InvalidRequestError) as err:
        llm.generate(["fine prompt", prompt], params)
    assert err.value.param == param and words in str(err.value)
    stats = llm.stats()
    assert (stats.num_waiting, stats.num_running, stats.kv_blocks_used) == (0, 0, 0)
    assert not llm.engine.requests and not llm.engine.core.requests


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("temperature", -0.5, "-0.5"),
        ("top_p", 0.0, "0.0"),
        ("top_p", 1.5, "1.5"),
        ("n", 0, "0"),
        ("top_k", -3, "-3"),
        ("min_p", 2.0, "2.0"),
        ("presence_penalty", 3.0, "3.0"),
        ("frequency_penalty", -2.5, "-2.5"),
        ("repetition_penalty", 0.0, "0.0"),
        ("max_tokens", 0, "0"),
        ("max_tokens", -4, "-4"),
        ("logprobs", -1, "-1"),
        ("stop", [""], "non-empty"),
        ("min_tokens", -1, "-1"),
        ("stop_token_ids", [-3], "-3"),
        ("seed", 2**64, "2^63"),
        ("top_k", 2**40, "2^31"),
        ("temperature", float("inf"), "finite"),
        ("presence_penalty", float("nan"), "presence_penalty"),
        # Integers past what the engine core's wire (64 bits) and the device's int32 carry.
        ("min_tokens", 10**30, "2^31"),
        ("max_tokens", 10**30, "2^31"),
        ("n", 10**30, "2^31"),
        ("logprobs", 2**31, "2^31"),
        ("seed", -(2**63) - 1, "-2^63"),
        ("stop_token_ids", [10**30], "2^31"),
        ("n", True, "True"),
        ("logit_bias", {5: 100.5}, "[-100, 100]"),
        ("logit_bias", {5: float("nan")}, "nan"),
        ("logit_bias", {-1: 1.0}, "-1"),
        ("logit_bias", {2**31: 1.0}, "2^31"),
    ],
)
def test_invalid_sampling_values_name_the_field(field, value, words):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.param == field and words in str(err.value)


def test_logprobs_beyond_max_logprobs(llm):
    with pytest.raises(InvalidRequestError, match="max_logprobs") as err:
        llm.generate("a", SamplingParams(logprobs=21))
    assert err.value.param == "logprobs"


def test_mismatched_params_list(llm):
    with pytest.raises(InvalidRequestError, match="2 SamplingParams for 3 prompts"):
        llm.generate(["a", "b", "c"], [SamplingParams(), SamplingParams()])


def test_invalid_chat_messages(llm):
    with pytest.raises(InvalidRequestError, match="'wizard'"):
        llm.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(InvalidRequestError, match="non-empty"):
        llm.chat([])


def copy_checkpoint(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_unknown_architecture(llama_checkpoint, tmp_path):
    path = copy_checkpoint(llama_checkpoint, tmp_path / "m")
    config = json.loads((path / "config.json").read_text())
    config["architectures"] = ["GPTNeoXForCausalLM"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="GPTNeoXForCausalLM") as err:
        LLM(str(path))
    assert str(path / "config.json") in str(err.value)


def test_missing_folder_config_and_weights(llama_checkpoint, tmp_path):
    with pytest.raises(CheckpointError, match="not found"):
        LLM(str(tmp_path / "nowhere"))
    path = copy_checkpoint(llama_checkpoint, tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors") as err:
        LLM(str(path))
    assert str(path) in str(err.value)
    (path / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json: file not found"):
        LLM(str(path))


def test_corrupt_shard_names_the_file(llama_checkpoint, tmp_path):
    path = copy_checkpoint(llama_checkpoint, tmp_path / "m")
    shard = path / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt") as err:
        LLM(str(path))
    assert str(shard) in str(err.value)
    shard.write_bytes(b"\xff" * 64)
    with pytest.raises(CheckpointError, match="corrupt"):
        LLM(str(path))


def test_missing_shard_listed_in_the_index(llama_checkpoint, tmp_path):
    path = copy_checkpoint(llama_checkpoint, tmp_path / "m")
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"model-00002-of-00002\.safetensors.*not found"):
        LLM(str(path))


def test_missing_tensor_is_named(llama_checkpoint, tmp_path):
    from safetensors.torch import load_file, save_file

    path = copy_checkpoint(llama_checkpoint, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"layers\.1\.mlp\.gate_up_proj\.weight"):
        LLM(str(path))


def test_engine_settings_are_checked(llama_checkpoint):
    with pytest.raises(InvalidRequestError, match="block_size"):
        LLM(str(llama_checkpoint), block_size=0)
    with pytest.raises(UnsupportedModelError, match="max_model_len 4096 exceeds"):
        LLM(str(llama_checkpoint), max_model_len=4096)
    with pytest.raises(InvalidRequestError, match="kv_cache_memory"):
        LLM(str(llama_checkpoint), kv_cache_memory=1000)
    with pytest.raises(InvalidRequestError, match="without chunked prefill"):
        LLM(str(llama_checkpoint), enable_chunked_prefill=False, max_num_batched_tokens=64)


def test_a_request_id_in_use_is_refused_and_the_first_request_is_kept(llm):
    engine = llm.engine
    engine.add_request("same", "hello", SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError, match="already in use") as err:
        engine.add_request("same", "other", SamplingParams(max_tokens=2))
    assert err.value.param == "request_id" and llm.stats().num_waiting == 1
    while engine.has_unfinished_requests():
        engine.step()
    assert llm.stats().kv_blocks_used == 0
