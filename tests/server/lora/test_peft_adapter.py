"""PEFT adapter folders read into the model's fused layout: each module's product lands in its
slice of qkv_proj or gate_up_proj with PEFT's scaling, so that base + B A equals PEFT's own
merged weights; and everything that cannot be served exactly is refused, naming the file and
the field."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from argosy.server.lora.adapter_folder import AdapterError
from argosy.server.lora.peft_adapter import read_adapter
from argosy.server.models.model_config import ModelConfig
from tests.adapters import ALL_MODULES, make_adapter, peft_model
from tests.checkpoints import build_checkpoint

QKV = {"q_proj": 0, "k_proj": 1, "v_proj": 2}
GATE_UP = {"gate_proj": 0, "up_proj": 1}


def merged(adapter, layer: int, fused: str, weight: torch.Tensor) -> torch.Tensor:
    """A fused layer's weight [out, in] with the adapter's change added: B A in each slice."""
    delta = torch.zeros_like(weight)
    for s in adapter.layers[layer].get(fused, []):
        delta[s.offset : s.offset + s.b.shape[0]] += s.b.float() @ s.a.float()
    return weight + delta


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("targets, rslora", [(ALL_MODULES, False), (["q_proj", "v_proj", "down_proj"], False),
                                             (["k_proj", "up_proj", "o_proj"], True)])  # fmt: skip
def test_base_plus_the_read_adapter_equals_pefts_merged_weights(checkpoints, tmp_path, arch, targets, rslora):
    base = checkpoints[arch]
    folder = make_adapter(base, tmp_path / "adapter", targets, rank=4, alpha=8, use_rslora=rslora)
    model = ModelConfig.from_folder(base)
    adapter = read_adapter("a", folder, model, max_rank=16, dtype=torch.float32)
    assert adapter.rank == 4 and {s.module for slices in adapter.layers[0].values() for s in slices} == set(targets)
    original = peft_model(base, targets, rank=4, alpha=8, use_rslora=rslora)
    peft_merged = original.merge_and_unload().model  # the same seed: the same adapter, merged by PEFT
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).model
    for i in range(model.num_layers):
        for fused, parts, parent in (("qkv_proj", QKV, "self_attn"), ("gate_up_proj", GATE_UP, "mlp")):
            before = torch.cat([getattr(getattr(plain.layers[i], parent), m).weight for m in parts])
            after = torch.cat([getattr(getattr(peft_merged.layers[i], parent), m).weight for m in parts])
            torch.testing.assert_close(merged(adapter, i, fused, before), after)
        for fused, module, parent in (("o_proj", "o_proj", "self_attn"), ("down_proj", "down_proj", "mlp")):
            before = getattr(getattr(plain.layers[i], parent), module).weight
            after = getattr(getattr(peft_merged.layers[i], parent), module).weight
            torch.testing.assert_close(merged(adapter, i, fused, before), after)


def test_the_identity_is_the_weights_content_not_the_name_or_place(llama_checkpoint, tmp_path):
    model = ModelConfig.from_folder(llama_checkpoint)
    one = make_adapter(llama_checkpoint, tmp_path / "one", seed=1)
    copy = shutil.copytree(one, tmp_path / "copy")
    other = make_adapter(llama_checkpoint, tmp_path / "other", seed=2)
    rescaled = shutil.copytree(one, tmp_path / "rescaled")
    edited(rescaled, lora_alpha=3)  # the same tensors, scaled otherwise: other weights
    folders = (("x", one), ("y", copy), ("x", other), ("x", rescaled))
    digests = [read_adapter(n, p, model, 16, torch.float32).digest for n, p in folders]
    assert digests[0] == digests[1] != digests[2] and digests[3] not in digests[:3]


def edited(folder, **changes):
    config = json.loads((folder / "adapter_config.json").read_text())
    config.update(changes)
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


REFUSALS = [
    (lambda f: edited(f, use_dora=True), "adapter_config.json: use_dora is set: DoRA adapters"),
    (lambda f: edited(f, modules_to_save=["lm_head"]), "adapter_config.json: modules_to_save is set"),
    (lambda f: edited(f, target_modules=["q_proj", "embed_tokens"]), "target_modules ['embed_tokens']"),
    (lambda f: edited(f, rank_pattern={"q_proj": 8}), "rank_pattern is set"),
    (lambda f: edited(f, bias="all"), "bias is 'all'"),
    (lambda f: edited(f, peft_type="IA3"), "peft_type must be LORA"),
    (lambda f: edited(f, r=32), "r is 32, above the server's max_lora_rank 16"),
    (lambda f: (f / "adapter_config.json").write_text("{not json"), "adapter_config.json: not valid JSON"),
    (lambda f: (f / "adapter_config.json").unlink(), "adapter_config.json: file not found"),
    (lambda f: (f / "adapter_model.safetensors").rename(f / "adapter_model.bin"), "pickled .bin adapters"),
    (lambda f: (f / "adapter_model.safetensors").write_bytes(b"garbage"), "corrupt or unreadable safetensors"),
]


@pytest.mark.parametrize("damage, message", REFUSALS)
def test_what_cannot_be_served_exactly_is_refused_naming_the_file_and_field(
    llama_checkpoint, tmp_path, damage, message
):
    folder = make_adapter(llama_checkpoint, tmp_path / "adapter", ["q_proj", "v_proj"])
    damage(folder)
    with pytest.raises(AdapterError, match=re.escape(message)) as e:
        read_adapter("a", folder, ModelConfig.from_folder(llama_checkpoint), max_rank=16, dtype=torch.float32)
    assert e.value.param == "lora_path" and str(folder) in str(e.value)


def test_an_adapter_for_another_base_model_is_refused_naming_the_tensor(llama_checkpoint, tmp_path):
    wider = build_checkpoint(tmp_path / "wider", "llama", hidden_size=96, intermediate_size=160)
    folder = make_adapter(wider, tmp_path / "adapter", ["q_proj"])
    with pytest.raises(AdapterError, match=r"layer 0 q_proj: lora_A \[4, 96\] and lora_B \[64, 4\] do not fit"):
        read_adapter("a", folder, ModelConfig.from_folder(llama_checkpoint), max_rank=16, dtype=torch.float32)


def test_an_embedding_adapter_is_refused_even_when_the_config_hides_it(llama_checkpoint, tmp_path):
    folder = make_adapter(llama_checkpoint, tmp_path / "adapter", ["q_proj", "embed_tokens"])
    edited(folder, target_modules=["q_proj"])
    with pytest.raises(AdapterError, match="an embedding or LM-head adapter"):
        read_adapter("a", folder, ModelConfig.from_folder(llama_checkpoint), max_rank=16, dtype=torch.float32)
