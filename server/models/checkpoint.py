"""Reading a checkpoint folder in Hugging Face layout: safetensors shards, memory-mapped.
Nothing here ever touches the network."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from argosy.server.exceptions import CheckpointError, CheckpointNotFoundError

INDEX_FILE = "model.safetensors.index.json"


def find_shards(folder: str | Path) -> list[Path]:
    """The checkpoint's shard files: those the index names, or every *.safetensors file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointNotFoundError(folder, "checkpoint folder not found")
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(index, f"not a valid safetensors index ({exc})") from exc
        shards = [folder / name for name in sorted(set(weight_map.values()))]
        for shard in shards:
            if not shard.is_file():
                raise CheckpointError(shard, f"shard listed in {INDEX_FILE} not found")
        return shards
    shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise CheckpointNotFoundError(folder, "no *.safetensors weights found")
    return shards


def iter_tensors(
    folder: str | Path, part_of: Callable[[str], tuple[int, int, int] | None] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yields (name, tensor) for every tensor of every shard; tensors are views of the
    memory-mapped file until the caller copies them. `part_of(name)`: the (dimension, start,
    length) of the tensor to read, for a tensor read in part (only those bytes are read)."""
    for shard in find_shards(folder):
        try:
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    part = part_of(name) if part_of is not None else None
                    if part is None:
                        yield name, f.get_tensor(name)
                        continue
                    dim, start, length = part
                    piece = f.get_slice(name)
                    index = [slice(None)] * len(piece.get_shape())
                    index[dim] = slice(start, start + length)
                    yield name, piece[tuple(index)]
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(shard, f"corrupt or unreadable safetensors file ({exc})") from exc


def checkpoint_manifest(folder: str | Path) -> dict[str, tuple[list[int], str]]:
    """Every tensor's name, shape and stored dtype, from the shards' headers (no tensor is read)."""
    manifest = {}
    for shard in find_shards(folder):
        try:
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    piece = f.get_slice(name)
                    manifest[name] = (list(piece.get_shape()), piece.get_dtype())
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise CheckpointError(shard, f"corrupt or unreadable safetensors file ({exc})") from exc
    return manifest


def manifest_differences(running: dict, new: dict) -> list[str]:
    """How a checkpoint's tensors differ from the running one's, each naming its tensor."""
    found = [f"tensor {n!r} is missing" for n in sorted(running.keys() - new.keys())]
    found += [f"tensor {n!r} is not in the running model" for n in sorted(new.keys() - running.keys())]
    for name in sorted(running.keys() & new.keys()):
        (shape, dtype), (new_shape, new_dtype) = running[name], new[name]
        if (shape, dtype) != (new_shape, new_dtype):
            found.append(f"tensor {name!r} is {new_dtype} {new_shape}, the running model's is {dtype} {shape}")
    return found
