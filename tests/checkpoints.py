"""Tiny random checkpoints in Hugging Face layout, built with transformers' own config
classes, with a small byte-level BPE tokenizer trained on the spot."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from argosy import LLM

ARCHS = ("llama", "qwen2", "qwen3")  # the architectures every engine test runs on
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in blocks.",
    "Continuous batching lets finished sequences leave and waiting ones join.",
    "Héllo wörld, ça va? Ünïcödé text: naïve café, 日本語のテキスト, emoji 🚀🎉.",
    "Numbers 0123456789 and symbols !@#$%^&*()[]{}<>.",
    "def f(x): return x * 2  # python code",
]


def write_tokenizer(folder: Path, vocab_size: int) -> int:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "chat_template": CHATML,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return tok.get_vocab_size()


def build_checkpoint(folder: Path, arch: str, seed: int = 0, max_shard_size: str | None = None, **overrides) -> Path:
    """Writes a tiny random `arch` ("llama", "qwen2", "qwen3", "mistral") checkpoint into folder."""
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
        Qwen3Config,
        Qwen3ForCausalLM,
    )

    classes = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
        "qwen3": (Qwen3Config, Qwen3ForCausalLM),
        "mistral": (MistralConfig, MistralForCausalLM),
    }
    folder.mkdir(parents=True, exist_ok=True)
    vocab = write_tokenizer(folder, 320)
    config_cls, model_cls = classes[arch]
    settings = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        initializer_range=0.3,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=1,
        pad_token_id=0,
    )
    settings.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**settings))
    with torch.no_grad():  # defaults of zero biases and unit norms would hide loading mistakes
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(std=0.3)
            elif name.endswith("norm.weight"):
                param.mul_(1 + 0.2 * torch.randn_like(param))
    model.save_pretrained(folder, **({"max_shard_size": max_shard_size} if max_shard_size else {}))
    return folder


def load_reference(folder: Path):
    """The same checkpoint in transformers, float32, for comparisons."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


@torch.inference_mode()
def reference_greedy(model, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding with transformers' forward, recomputing the whole sequence each step."""
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt_ids) :]


def tiny_llm(path: Path, **kwargs) -> LLM:
    """The offline engine on a test checkpoint: float32 (to compare with transformers) and a
    small byte-budget cache, unless the test says otherwise."""
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("kv_cache_memory", 4 << 20)
    return LLM(str(path), **kwargs)
