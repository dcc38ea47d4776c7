"""A checkpoint in Hugging Face layout with random weights, of a real model's shape, written
without network or transformers: for measuring the engine end to end where no real checkpoint
can be fetched (the GPU machine). Its tokenizer maps every id of the vocabulary to a word of its
own, so any sampled token detokenizes.

    python bench/random_checkpoint.py FOLDER [--shape llama3-8b]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

SHAPES = {
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, vocab_size=128256),
    "llama3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                        num_key_value_heads=8, vocab_size=128256),
    "toy": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=512),
}  # fmt: skip
SHARD_BYTES = 4 << 30


def parameter_shapes(shape: dict) -> dict[str, tuple[int, ...]]:
    hidden, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    head_dim = hidden // shape["num_attention_heads"]
    kv = shape["num_key_value_heads"] * head_dim
    shapes = {
        "model.embed_tokens.weight": (vocab, hidden),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (vocab, hidden),
    }
    for i in range(shape["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (hidden, hidden), p + "self_attn.k_proj.weight": (kv, hidden),
            p + "self_attn.v_proj.weight": (kv, hidden), p + "self_attn.o_proj.weight": (hidden, hidden),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
        }  # fmt: skip
    return shapes


def write(folder: Path, shape_name: str, device: torch.device, seed: int = 0) -> Path:
    """Writes the checkpoint into folder (bfloat16 weights drawn on `device`, norms near 1)."""
    shape = SHAPES[shape_name]
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device).manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}

    def flush() -> None:
        name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
        shard.clear()

    for name, dims in parameter_shapes(shape).items():
        values = torch.randn(dims, generator=generator, device=device, dtype=torch.float32)
        values = 1 + 0.1 * values if len(dims) == 1 else values * dims[-1] ** -0.5
        shard[name] = values.to(torch.bfloat16).cpu()
        if sum(t.numel() * 2 for t in shard.values()) >= SHARD_BYTES:
            flush()
    if shard:
        flush()
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = dict(
        architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu", rms_norm_eps=1e-5,
        rope_theta=500000.0, max_position_embeddings=8192, tie_word_embeddings=False, torch_dtype="bfloat16",
        bos_token_id=0, eos_token_id=1, **shape,
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer(models.WordLevel({f"w{i}": i for i in range(shape["vocab_size"])}, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "w0", "eos_token": "w1"}))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    args = parser.parse_args()
    write(args.folder, args.shape, torch.device("cuda" if torch.cuda.is_available() else "cpu"))


if __name__ == "__main__":
    main()
