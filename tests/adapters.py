"""PEFT LoRA adapters for the tiny test checkpoints, made with the `peft` package itself: random
and non-zero (PEFT starts B at zero), saved as PEFT saves them."""

from __future__ import annotations

from pathlib import Path

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(base: Path, targets: list[str], rank: int = 4, alpha: float = 8, seed: int = 0, **config):
    """The base checkpoint in transformers (float32) wrapped by PEFT with a random adapter."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    lora = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, **config)
    return get_peft_model(model, lora).eval()


def make_adapter(base: Path, folder: Path, targets: list[str] = ALL_MODULES, **kwargs) -> Path:
    peft_model(base, targets, **kwargs).save_pretrained(folder)
    return folder


def merged_reference(base: Path, folder: Path | None):
    """transformers' model of `base` with the saved adapter at `folder` merged into it by PEFT
    (None: the base alone), float32, for reference_greedy."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if folder is None:
        return model.eval()
    return PeftModel.from_pretrained(model, folder).merge_and_unload().eval()
