"""Building the model and filling it from a checkpoint's tensors.

Checkpoint names follow Hugging Face; our model fuses q/k/v and gate/up into single matmuls,
so each checkpoint tensor lands in a slice of one of our parameters."""

from __future__ import annotations

import contextlib
import re

import torch

from argosy.kernels.attention_interface import AttentionBackend
from argosy.server.exceptions import CheckpointError
from argosy.server.models.checkpoint import first_non_finite, stored_tensors
from argosy.server.models.decoder import CausalLM
from argosy.server.models.layers import RotaryEmbedding
from argosy.server.models.linear import process_weights
from argosy.server.models.linear_factory import PLAIN, LinearFactory
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import TensorRead, read_tensors
from argosy.server.parallel.group import SINGLE, TensorParallel
from argosy.server.parallel.stages import PipelineStage

_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_VOCABULARY = {"embed_tokens.weight", "lm_head.weight"}
_IGNORED = re.compile(r".*rotary_emb\.inv_freq$")


def load_model(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    max_position: int,
    backend: AttentionBackend,
    linears: LinearFactory = PLAIN,
    shards: TensorParallel = SINGLE,
    stage: PipelineStage | None = None,
) -> CausalLM:
    """The model with its linear layers in the formats `linears` picks, filled from the
    checkpoint (each weight loaded as stored, then processed into its format). With tensor
    parallelism, this rank's share of it; with pipeline parallelism, its stage's; either read from
    the checkpoint alone."""
    layout, local = shards.layout, shards.layout.local_config(cfg)
    with torch.device("meta"), _default_dtype(dtype):
        model = CausalLM(local, max_position, backend, linears, shards.all_reduce, shards.vocab(cfg), stage)
    model.to_empty(device=device)
    # Buffers do not survive to_empty; the rotary tables are recomputed on the device.
    model.rotary = RotaryEmbedding(cfg.head_dim, max_position, cfg.rope, backend.kernels).to(device)
    params = dict(model.named_parameters())
    loaded: set[tuple[str, int]] = set()
    reads = []
    for stored in stored_tensors(cfg.path):
        name = stored.name
        if _IGNORED.match(name) or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        target, part = _target(name)
        if stage is not None and (target := _in_stage(target, stage, cfg.tie_word_embeddings)) is None:
            continue  # another stage's
        if target not in params:
            raise CheckpointError(cfg.path, f"unexpected tensor {name!r} for {cfg.architecture}")
        dest = _slice(params[target], part, local, target)
        if target in _VOCABULARY and layout.size > 1:  # the last rank's run ends in zero rows
            dest = dest.zero_().narrow(0, 0, layout.vocab_part(cfg)[1])
        piece = layout.shard(name, cfg)
        shape = list(stored.shape)
        if piece is not None:
            dim, start, length = piece
            if start + length > shape[dim]:
                raise CheckpointError(cfg.path, f"tensor {name!r} has shape {shape}, too small for the model's")
            shape[dim] = length
        if list(dest.shape) != shape:
            raise CheckpointError(cfg.path, f"tensor {name!r} has shape {shape}, expected {list(dest.shape)}")
        reads.append(TensorRead(stored, dest, piece))
        loaded.add((target, part))
    missing = [name for name in params if not _fully_loaded(name, loaded)]
    if missing:
        raise CheckpointError(
            cfg.path,
            f"missing tensors for: {', '.join(missing[:5])}"
            + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""),
        )
    with torch.no_grad():
        model.checkpoint_read = read_tensors(reads)
        if (bad := first_non_finite({r.stored.name: r.dest for r in reads})) is not None:
            raise CheckpointError(cfg.path, f"tensor {bad!r} holds NaN or infinite values")
    if shards.layout.size > 1:  # split by input columns: their rows' scales span every rank's slice
        for layer in model.layers:
            layer.self_attn.o_proj.row_max = layer.mlp.down_proj.row_max = shards.max_over_ranks
    process_weights(model)
    if model.lm_head is None and model.norm is not None:  # a tied head, on the stage that computes the logits
        model.lm_head = linears.tied_head(model.embed_tokens.weight)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what the loaded layouts held goes back before the KV cache is sized
    return model.eval()


def _target(name: str) -> tuple[str, int]:
    name = name.removeprefix("model.")
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part in _FUSED:
            fused, index = _FUSED[part]
            return ".".join([*parts[:i], fused, *parts[i + 1 :]]), index
    return name, -1


def _in_stage(target: str, stage: PipelineStage, tied: bool) -> str | None:
    """The name of `target` in a stage's model (its layers numbered from 0); None for a tensor
    another stage holds. The embedding is the first stage's, and the last's with a `tied` head."""
    parts = target.split(".")
    if parts[0] == "layers":
        index = int(parts[1])
        return ".".join(["layers", str(index - stage.start), *parts[2:]]) if stage.start <= index < stage.end else None
    held = {"embed_tokens": stage.first or (stage.last and tied), "norm": stage.last, "lm_head": stage.last}
    return target if held.get(parts[0], True) else None


def _slice(param: torch.Tensor, part: int, cfg: ModelConfig, target: str) -> torch.Tensor:
    if part < 0:
        return param.data
    if ".qkv_proj." in target:
        q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        start, size = [(0, q), (q, kv), (q + kv, kv)][part]
    else:
        start, size = part * cfg.intermediate_size, cfg.intermediate_size
    return param.data.narrow(0, start, size)


def _fully_loaded(name: str, loaded: set[tuple[str, int]]) -> bool:
    if ".qkv_proj." in name:
        return all((name, i) in loaded for i in range(3))
    if ".gate_up_proj." in name:
        return all((name, i) in loaded for i in range(2))
    return (name, -1) in loaded


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
