"""A PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`) checked
against the base model without loading a tensor (the API process has no torch): its settings,
and the names and shapes of its tensors from the safetensors header. Whatever cannot be served
exactly is refused, naming the file and the field: DoRA, modules_to_save, embedding or LM-head
adapters, bias terms, per-module rank or alpha patterns, a rank above the server's limit, a
pickled `.bin` adapter, shapes that do not fit the base model. Its identity is the digest of
its weights file and their scaling, never its name or place."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig
from argosy.server.regular_files import read_regular, regular_fd

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_HEADER_BYTES = 16 << 20  # of a weights file's safetensors header (thousands of tensors)
HEADER_READ_BYTES = 8 + MAX_HEADER_BYTES
_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
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

    def __init__(self, path: Path | str, message: str):
        super().__init__(f"{path}: {message}", param="lora_path")


@dataclass(frozen=True)
class AdapterFolder:
    """A checked adapter folder: (layer, module) -> the names of its A and B tensors."""

    path: Path
    rank: int
    scaling: float  # alpha / r, or alpha / sqrt(r) with rslora
    digest: str  # sha256 of the weights file and the scaling applied to it, hex
    pairs: dict[tuple[int, str], tuple[str, str]]

    @property
    def weights(self) -> Path:
        return self.path / WEIGHTS_FILE


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


def inspect_adapter(path: str | Path, model: ModelConfig, max_rank: int) -> AdapterFolder:
    """Checks the folder at `path` against the base `model`."""
    return read_adapter_folder(path, model, max_rank)[0]


def read_adapter_folder(path: str | Path, model: ModelConfig, max_rank: int) -> tuple[AdapterFolder, bytes]:
    """The folder at `path` checked against the base `model`, and its weights file's bytes (what
    the digest is of). Everything the weights' header says is checked before the rest is read:
    the file's size is then bounded by the base model's."""
    try:
        return _read_adapter_folder(Path(path), model, max_rank)
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise AdapterError(path, f"unreadable ({exc.strerror or exc})") from exc


def _read_adapter_folder(folder: Path, model: ModelConfig, max_rank: int) -> tuple[AdapterFolder, bytes]:
    config = _read_config(folder)
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1:
        raise AdapterError(folder / CONFIG_FILE, f"r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise AdapterError(folder / CONFIG_FILE, f"r is {rank}, above the server's max_lora_rank {max_rank}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise AdapterError(folder / CONFIG_FILE, f"lora_alpha must be a finite number, got {alpha!r}")
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    weights = _weights_file(folder)
    head, size = _read(weights, HEADER_READ_BYTES)
    shapes = _header_shapes(weights, head, size)
    places = placement(model)
    pairs = {}
    for (layer, module), (a, b) in sorted(_pairs(weights, shapes, model).items()):
        _, _, fan_in, fan_out = places[module]
        if shapes[a] != [rank, fan_in] or shapes[b] != [fan_out, rank]:
            raise AdapterError(
                weights,
                f"layer {layer} {module}: lora_A {shapes[a]} and lora_B {shapes[b]} do not fit the base model "
                f"(expected [{rank}, {fan_in}] and [{fan_out}, {rank}])",
            )
        pairs[layer, module] = (a, b)
    data, now = _read(weights, size)  # bounded by the header just checked
    if now != size or _header_shapes(weights, data, size) != shapes:  # replaced since its header was read
        raise AdapterError(weights, "the file changed while it was read")
    if (bad := non_finite_tensor(data)) is not None:
        raise AdapterError(weights, f"tensor {bad!r} holds NaN or infinite values")
    digest = hashlib.sha256(data)
    digest.update(f"rank={rank};scaling={scaling!r}".encode())  # the same tensors scaled otherwise differ
    return AdapterFolder(folder, rank, scaling, digest.hexdigest(), pairs), data


def _weights_file(folder: Path) -> Path:
    weights = folder / WEIGHTS_FILE
    if not weights.exists():
        if (folder / "adapter_model.bin").exists():
            raise AdapterError(
                folder / "adapter_model.bin", "pickled .bin adapters are not supported: save it as safetensors"
            )
        raise AdapterError(weights, "file not found")
    return weights


def _read(weights: Path, limit: int) -> tuple[bytes, int]:
    """The file's first `limit` bytes at most, and its size."""
    try:
        with os.fdopen(regular_fd(weights), "rb") as f:
            return f.read(limit), os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise AdapterError(weights, f"unreadable ({exc.strerror or exc})") from exc


def _read_config(folder: Path) -> dict:
    file = folder / CONFIG_FILE
    if not folder.is_dir():
        raise AdapterError(folder, "adapter folder not found")
    if not file.exists():
        raise AdapterError(file, "file not found (a PEFT adapter folder holds adapter_config.json)")
    try:
        config = json.loads(read_regular(file))
    except OSError as exc:
        raise AdapterError(file, f"unreadable ({exc.strerror or exc})") from exc
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


def _header_shapes(weights: Path, head: bytes, size: int) -> dict[str, list[int]]:
    """Each tensor's shape, from the safetensors header at the start of `head` (the file's first
    bytes), which is checked to describe the file of `size` bytes exactly: floating-point
    tensors whose bytes fit their shapes, lying end to end, nothing after them."""
    try:
        length = int.from_bytes(head[:8], "little")
        if len(head) < 8 or not 2 <= length <= min(MAX_HEADER_BYTES, size - 8, len(head) - 8):
            raise ValueError(f"a header of {length} bytes in a file of {size}")
        header = json.loads(head[8 : 8 + length])
        if not isinstance(header, dict):
            raise ValueError("no header")
        shapes, end_of_data = {}, 0
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            shape = [int(d) for d in entry["shape"]]
            itemsize = _ITEMSIZE.get(entry["dtype"])
            if itemsize is None:
                raise ValueError(f"tensor {key!r} has dtype {entry['dtype']}; LoRA weights are floating point")
            if any(d < 0 for d in shape) or not 0 <= begin <= end or end - begin != math.prod(shape) * itemsize:
                raise ValueError(f"tensor {key!r} does not lie in the file as its header says")
            shapes[key], end_of_data = shape, max(end_of_data, end)
        if size != 8 + length + end_of_data:
            raise ValueError(f"{size} bytes, where its header describes {8 + length + end_of_data}")
        return shapes
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        raise AdapterError(weights, f"corrupt or unreadable safetensors file ({exc})") from exc


def _pairs(weights: Path, shapes: dict[str, list[int]], model: ModelConfig) -> dict[tuple[int, str], tuple[str, str]]:
    """(layer, module) -> the names of (A, B), every tensor accounted for."""
    halves: dict[tuple[int, str], dict[str, str]] = {}
    for key in shapes:
        m = _TENSOR.match(key)
        if m is None:
            what = "an embedding or LM-head adapter" if "embed" in key or "lm_head" in key else "not a LoRA tensor"
            raise AdapterError(weights, f"tensor {key!r}: {what}, which is not supported")
        layer, module, half = int(m.group(1)), m.group(2), m.group(3)
        if module not in MODULES:
            raise AdapterError(weights, f"tensor {key!r}: module {module!r} is not supported")
        if layer >= model.num_layers:
            raise AdapterError(weights, f"tensor {key!r}: layer {layer}, but the base model has {model.num_layers}")
        halves.setdefault((layer, module), {})[half] = key
    for (layer, module), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise AdapterError(weights, f"layer {layer} {module}: lora_A and lora_B must come together")
    if not halves:
        raise AdapterError(weights, "no LoRA tensors")
    return {key: (pair["A"], pair["B"]) for key, pair in halves.items()}


# Per dtype: its size, and the byte offsets within an element (little-endian) whose bits, masked,
# are all set exactly when the exponent is: the infinities and NaNs.
_EXPONENT_BYTES = {
    "F64": (8, ((7, 0x7F), (6, 0xF0))),
    "F32": (4, ((3, 0x7F), (2, 0x80))),
    "F16": (2, ((1, 0x7C),)),
    "BF16": (2, ((1, 0x7F), (0, 0x80))),
}


def non_finite_tensor(data: bytes) -> str | None:
    """The name of the first tensor of a safetensors file's bytes (header checked) that holds a NaN
    or an infinity, or None. Without torch, at C speed: each exponent byte of every element is
    sliced out and mapped to 1 where its exponent bits are all set, and the elements whose bytes
    all say so are found by AND-ing those maps as integers."""
    length = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + length])
    base = 8 + length
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        itemsize, masks = _EXPONENT_BYTES[entry["dtype"]]
        hits = -1
        for offset, mask in masks:
            table = bytes(1 if b & mask == mask else 0 for b in range(256))
            hits &= int.from_bytes(data[base + begin + offset : base + end : itemsize].translate(table), "little")
            if not hits:
                break
        if hits:
            return name
    return None
