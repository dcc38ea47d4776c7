"""Swapping a running model's weights for a checkpoint's, in place: the checkpoint is first read
whole into a staging copy in host memory by the model loader (every tensor's name and shape
checked there), and only then copied into the running model, layer by layer, each linear layer
into its own format (plain, FP8, packed). Every running tensor keeps its address, so the CUDA
graphs captured on them stay valid; the LoRA slots are not touched."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from argosy.kernels.attention_backend import TorchAttention
from argosy.server.exceptions import CheckpointError
from argosy.server.models.checkpoint import checkpoint_manifest, manifest_differences
from argosy.server.models.decoder import CausalLM
from argosy.server.models.linear import Linear
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import SINGLE, TensorParallel
from argosy.server.parallel.stages import PipelineStage


def stage_checkpoint(
    running: ModelConfig,
    path: str,
    dtype: torch.dtype,
    max_position: int,
    shards: TensorParallel = SINGLE,
    stage: PipelineStage | None = None,
) -> CausalLM:
    """The checkpoint at `path` in host memory, as plain layers of the running model's shapes (with
    tensor parallelism, this rank's slices of it; with pipeline parallelism, its stage's layers);
    raises CheckpointError, naming the tensor, for anything that differs from the running one in
    name, shape or stored dtype."""
    check_same_tensors(running.path, path)
    config = dataclasses.replace(running, path=str(path))
    return load_model(config, dtype, torch.device("cpu"), max_position, TorchAttention(), shards=shards, stage=stage)


def check_same_tensors(running: str, path: str) -> None:
    """Raises CheckpointError unless the checkpoint at `path` has the running one's tensors:
    the same names, shapes and stored dtypes."""
    found = manifest_differences(checkpoint_manifest(running), checkpoint_manifest(path))
    if found:
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise CheckpointError(path, "does not match the running model: " + "; ".join(found[:5]) + more)


@torch.no_grad()
def copy_weights(staged: CausalLM, model: nn.Module, dtype: torch.dtype) -> None:
    """The staged weights into `model`, in place."""
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            if name == "lm_head" and staged.lm_head is None:  # tied: the format keeps its own copy
                module.reload(staged.embed_tokens.weight, None, dtype)
            else:
                source = staged.get_submodule(name)
                module.reload(source.weight, source.bias, dtype)
        elif not name.startswith("lm_head"):
            for param_name, param in module.named_parameters(recurse=False):
                param.copy_(staged.get_submodule(name).get_parameter(param_name))
