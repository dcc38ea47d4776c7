"""A checkpoint folder in Hugging Face layout: its safetensors shards, and where each tensor's
bytes lie in them (read from the shards' headers; tensor_reader.py reads the bytes). Nothing
here ever touches the network."""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from argosy.server.exceptions import CheckpointError, CheckpointNotFoundError
from argosy.server.regular_files import read_regular, regular_fd

INDEX_FILE = "model.safetensors.index.json"


def find_shards(folder: str | Path) -> list[Path]:
    """The checkpoint's shard files: those the index names, or every *.safetensors file."""
    folder = Path(folder)
    try:
        return _find_shards(folder)
    except OSError as exc:  # a name too long, a loop of links, no permission
        raise CheckpointError(folder, f"unreadable ({exc.strerror or exc})") from exc


def _find_shards(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise CheckpointNotFoundError(folder, "checkpoint folder not found")
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(read_regular(index))["weight_map"]
            names = sorted(set(weight_map.values()))
        except OSError as exc:
            raise CheckpointError(index, f"unreadable ({exc.strerror or exc})") from exc
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(index, f"not a valid safetensors index ({exc})") from exc
        if bad := next((n for n in names if not isinstance(n, str) or Path(n).name != n or n in ("", ".", "..")), None):
            raise CheckpointError(index, f"a shard must be a file of the folder, got {bad!r}")
        shards = [folder / name for name in names]
        for shard in shards:
            if not shard.is_file():
                raise CheckpointError(shard, f"shard listed in {INDEX_FILE} not found")
        return shards
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise CheckpointNotFoundError(folder, "no *.safetensors weights found")
    return shards


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor's bytes lie in a shard, from the shard's header."""

    name: str
    file: Path
    offset: int  # of its first byte in the file
    dtype: str  # as safetensors names it: "BF16", "F32", ...
    shape: tuple[int, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.torch_dtype.itemsize


_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
_MAX_HEADER = 100 << 20  # safetensors' own limit


def stored_tensors(folder: str | Path) -> list[StoredTensor]:
    """Every tensor of every shard, from the shards' headers (no tensor is read), each checked
    to lie within its file."""
    return [tensor for shard in find_shards(folder) for tensor in _shard_tensors(shard)]


def _shard_tensors(shard: Path) -> list[StoredTensor]:
    try:
        with os.fdopen(regular_fd(shard), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            (length,) = struct.unpack("<Q", f.read(8).ljust(8, b"\0"))
            if not 2 <= length <= min(_MAX_HEADER, size - 8):
                raise ValueError(f"a header of {length} bytes in a file of {size}")
            header = json.loads(f.read(length))
        data = 8 + length
        tensors = []
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            tensor = StoredTensor(name, shard, data + begin, entry["dtype"], tuple(entry["shape"]))
            if tensor.dtype not in _DTYPES:
                raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}, which Argosy does not read")
            if end - begin != tensor.nbytes or not 0 <= begin <= end <= size - data:
                raise ValueError(f"tensor {name!r} does not lie within the file as its header says")
            tensors.append(tensor)
        return tensors
    except (ValueError, KeyError, TypeError, OSError, struct.error) as exc:
        raise CheckpointError(shard, f"corrupt or unreadable safetensors file ({exc})") from exc


def checkpoint_manifest(folder: str | Path) -> dict[str, tuple[list[int], str]]:
    """Every tensor's name, shape and stored dtype, from the shards' headers (no tensor is read)."""
    return {t.name: (list(t.shape), t.dtype) for t in stored_tensors(folder)}


def manifest_differences(running: dict, new: dict) -> list[str]:
    """How a checkpoint's tensors differ from the running one's, each naming its tensor."""
    found = [f"tensor {n!r} is missing" for n in sorted(running.keys() - new.keys())]
    found += [f"tensor {n!r} is not in the running model" for n in sorted(new.keys() - running.keys())]
    for name in sorted(running.keys() & new.keys()):
        (shape, dtype), (new_shape, new_dtype) = running[name], new[name]
        if (shape, dtype) != (new_shape, new_dtype):
            found.append(f"tensor {name!r} is {new_dtype} {new_shape}, the running model's is {dtype} {shape}")
    return found


def first_non_finite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first tensor holding a NaN or an infinity, or None; the device is waited
    for once, whatever the number of tensors."""
    if not tensors:
        return None
    finite = torch.stack([_all_finite(t) for t in tensors.values()]).tolist()
    return next((name for name, ok in zip(tensors, finite) if not ok), None)


def _all_finite(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dtype == torch.float8_e4m3fn:  # no infinities; NaN is every exponent and mantissa bit set
        return ((tensor.view(torch.uint8) & 0x7F) != 0x7F).all()
    return torch.isfinite(tensor).all()
