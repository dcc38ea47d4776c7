"""Reading a PEFT LoRA adapter into the model's own layout: each adapted projection (q, k, v,
o, gate, up, down; any subset) becomes a slice of the fused layer it belongs to (q/k/v of
qkv_proj, gate/up of gate_up_proj), with its A [rank, in] and its B [out, rank] already
multiplied by the adapter's scaling. The folder is checked first (adapter_folder.py), and the
tensors come from the very bytes its digest is of."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load as load_safetensors

from argosy.server.lora.adapter_folder import AdapterError, placement, read_adapter_folder
from argosy.server.models.model_config import ModelConfig


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


def read_adapter(name: str, path: str | Path, model: ModelConfig, max_rank: int, dtype: torch.dtype) -> LoRAAdapter:
    """The adapter at `path`, checked against the base `model`, its tensors in `dtype` on the host."""
    folder, data = read_adapter_folder(path, model, max_rank)
    try:
        tensors = load_safetensors(data)
    except Exception as exc:  # the header was sound; the data behind it is not
        raise AdapterError(folder.weights, f"corrupt or unreadable safetensors file ({exc})") from exc
    places = placement(model)
    layers: list[dict[str, list[LoRASlice]]] = [{} for _ in range(model.num_layers)]
    for (layer, module), (a_key, b_key) in folder.pairs.items():
        fused, offset, _, _ = places[module]
        a, b = tensors[a_key], (tensors[b_key].float() * folder.scaling).to(dtype)
        layers[layer].setdefault(fused, []).append(LoRASlice(module, offset, a.to(dtype).contiguous(), b.contiguous()))
    return LoRAAdapter(name, str(folder.path), folder.rank, folder.digest, layers)
