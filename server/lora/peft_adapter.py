"""Reading a PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`) into
the model's own layout: each adapted projection (q, k, v, o, gate, up, down; any subset) becomes
a slice of the fused layer it belongs to (q/k/v of qkv_proj, gate/up of gate_up_proj), with its
A [rank, in] and its B [out, rank] already multiplied by the adapter's scaling (alpha / r, or
alpha / sqrt(r) with rslora). Whatever this cannot serve exactly is refused, naming the field or
the file: DoRA, modules_to_save, embedding or LM-head adapters, bias terms, per-module rank or
alpha patterns, a rank above the server's limit, a pickled `.bin` adapter, shapes that do not fit
the base model."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_TENSOR = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# Settings PEFT may write whose non-default value changes the product: each refused by name.
_UNSUPPORTED = {
    "use_dora": "DoRA adapters",
    "modules_to_save": "modules_to_save (fully trained copies of base layers)",
    "rank_pattern": "a rank_pattern (ranks per module)",
    "alpha_pattern": "an alpha_pattern (alphas per module)",
    "layer_replication": "layer_replication",
    "fan_in_fan_out": "fan_in_fan_out (transposed weights)",
    "lora_bias": "LoRA bias terms",
    "use_qalora": "QA-LoRA",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)",
    "trainable_token_indices": "trainable token indices (embedding updates)",
}


class AdapterError(InvalidRequestError):
    """An adapter folder that cannot be served; the message names the file and the field."""

    def __init__(self, path: Path, message: str):
        super().__init__(f"{path}: {message}", param="lora_path")


@dataclass(frozen=True)
class LoRASlice:
    """One adapted projection: it adds x @ a.T @ b.T to rows offset .. offset + b.shape[0] of
    its fused layer's output."""

    module: str
    offset: int
    a: torch.Tensor  # [rank, in]
    b: torch.Tensor  # [out, rank], scaled


@dataclass
class LoRAAdapter:
    name: str
    path: str
    rank: int
    digest: str  # of the weights file: the adapter's identity (never its name) wherever KV is shared
    # Per decoder layer: fused layer ("qkv_proj", "o_proj", "gate_up_proj", "down_proj") -> slices.
    layers: list[dict[str, list[LoRASlice]]] = field(repr=False)

    @property
    def nbytes(self) -> int:
        return sum(s.a.nbytes + s.b.nbytes for layer in self.layers for slices in layer.values() for s in slices)


def placement(model: ModelConfig) -> dict[str, tuple[str, int, int, int]]:
    """Each module's fused layer, its rows' offset there, and its (in, out) features."""
    hidden, inter = model.hidden_size, model.intermediate_size
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    return {
        "q_proj": ("qkv_proj", 0, hidden, q),
        "k_proj": ("qkv_proj", q, hidden, kv),
        "v_proj": ("qkv_proj", q + kv, hidden, kv),
        "o_proj": ("o_proj", 0, q, hidden),
        "gate_proj": ("gate_up_proj", 0, hidden, inter),
        "up_proj": ("gate_up_proj", inter, hidden, inter),
        "down_proj": ("down_proj", 0, inter, hidden),
    }


def read_adapter(name: str, path: str | Path, model: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """The adapter at `path`, checked against the base `model`, its tensors in `dtype` on the host."""
    folder = Path(path)
    config = _read_config(folder)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(folder / CONFIG_FILE, f"r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(folder / CONFIG_FILE, f"r is {rank}, above the server's max_lora_rank {max_rank}")
    if not isinstance(alpha, (int, float)):
        raise AdapterError(folder / CONFIG_FILE, f"lora_alpha must be a number, got {alpha!r}")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = folder / WEIGHTS_FILE
    tensors = _read_tensors(folder, weights)
    places = placement(model)
    layers: list[dict[str, list[LoRASlice]]] = [{} for _ in range(model.num_layers)]
    for (layer, module), (a, b) in sorted(_pairs(weights, tensors, model).items()):
        fused, offset, fan_in, fan_out = places[module]
        if a.shape != (rank, fan_in) or b.shape != (fan_out, rank):
            raise AdapterError(
                weights,
                f"layer {layer} {module}: lora_A {list(a.shape)} and lora_B {list(b.shape)} do not fit the base model "
                f"(expected [{rank}, {fan_in}] and [{fan_out}, {rank}])",
            )
        b = (b.float() * scaling).to(dtype)
        layers[layer].setdefault(fused, []).append(LoRASlice(module, offset, a.to(dtype).contiguous(), b.contiguous()))
    return LoRAAdapter(name, str(folder), rank, _digest(weights), layers)


def _read_config(folder: Path) -> dict:
    file = folder / CONFIG_FILE
    if not folder.is_dir():
        raise AdapterError(folder, "adapter folder not found")
    if not file.is_file():
        raise AdapterError(file, "file not found (a PEFT adapter folder holds adapter_config.json)")
    try:
        config = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AdapterError(file, f"not valid JSON ({exc})") from exc
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(file, f"peft_type must be LORA, got {config.get('peft_type')!r}")
    for key, what in _UNSUPPORTED.items():
        if config.get(key):
            raise AdapterError(file, f"{key} is set: {what} are not supported")
    if config.get("bias", "none") != "none":
        raise AdapterError(file, f"bias is {config['bias']!r}: adapters with bias terms are not supported")
    targets = config.get("target_modules")
    if isinstance(targets, list):
        unknown = sorted(set(targets) - set(MODULES))
        if unknown:
            raise AdapterError(
                file, f"target_modules {unknown} are not supported (embedding and LM-head adapters among them); "
                f"supported: {', '.join(MODULES)}",
            )  # fmt: skip
    return config


def _read_tensors(folder: Path, weights: Path) -> dict[str, torch.Tensor]:
    if not weights.is_file():
        if (folder / "adapter_model.bin").is_file():
            raise AdapterError(
                folder / "adapter_model.bin", "pickled .bin adapters are not supported: save it as safetensors"
            )
        raise AdapterError(weights, "file not found")
    try:
        with safe_open(str(weights), framework="pt") as f:
            return {key: f.get_tensor(key) for key in f.keys()}  # noqa: SIM118 (a safetensors handle)
    except (SafetensorError, OSError, RuntimeError) as exc:
        raise AdapterError(weights, f"corrupt or unreadable safetensors file ({exc})") from exc


def _pairs(
    weights: Path, tensors: dict[str, torch.Tensor], model: ModelConfig
) -> dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]:
    """(layer, module) -> (A, B), every tensor accounted for."""
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _TENSOR.match(key)
        if m is None:
            what = "an embedding or LM-head adapter" if "embed" in key or "lm_head" in key else "not a LoRA tensor"
            raise AdapterError(weights, f"tensor {key!r}: {what}, which is not supported")
        layer, module, half = int(m.group(1)), m.group(2), m.group(3)
        if module not in MODULES:
            raise AdapterError(weights, f"tensor {key!r}: module {module!r} is not supported")
        if layer >= model.num_layers:
            raise AdapterError(weights, f"tensor {key!r}: layer {layer}, but the base model has {model.num_layers}")
        halves.setdefault((layer, module), {})[half] = tensor
    for (layer, module), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(weights, f"layer {layer} {module}: lora_A and lora_B must come together")
    if not halves:
        raise AdapterError(weights, "no LoRA tensors")
    return {key: (pair["A"], pair["B"]) for key, pair in halves.items()}


def _digest(weights: Path) -> str:
    h = hashlib.sha256()
    with weights.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
