"""A CausalLM's decoder layers in one C++ call per step on CPU (kernels/cpu_decoder.cpp).

decoder.py's modules make about ten Python calls and views per layer (module calls, the q/k/v
split, the kernels' wrappers); on a slow core they are a sixth of one sequence's decode step.
The C++ decoder runs the same kernels in the same order, so a step gives the same bits either
way. The modules stay the reference, and the path of every model the kernels do not cover:
LoRA additions, tensor parallelism, weights outside the two kernel formats (float32, FP8,
oneDNN-packed), the pure-PyTorch and Triton backends, and `--enforce-eager`."""

from __future__ import annotations

import torch

from argosy.kernels import cpu_kernels
from argosy.kernels.attention_backend import TorchAttention
from argosy.kernels.attention_interface import AttentionBackend
from argosy.kernels.paged_attention import AttentionMetadata
from argosy.server.models.decoder import CausalLM, DecoderLayer
from argosy.server.models.int8_linear import Int8Linear
from argosy.server.models.linear import Linear
from argosy.server.models.paired_linear import PairedLinear


class OneCallLayers:
    def __init__(self, decoder: object):
        self.decoder = decoder  # the kernels' CpuDecoder, holding the layers' weights (not copies)

    def __call__(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As the layers' loop in CausalLM.forward: the last layer's output and the residual stream."""
        # With the CPU kernels every token is a decode's or a chunk's (paged_attention.build_metadata).
        assert not meta.tiles and not meta.fresh_prefills, "a step the C++ attention kernels do not cover"
        d, c = meta.decodes, meta.chunks
        decodes = [] if d is None else [d.q_index, d.block_tables, d.seq_lens]
        chunks = [] if c is None else [c.q_start, c.q_len, c.seq_lens, c.block_tables]
        return self.decoder.forward(x, residual, positions.contiguous(), kv_cache, meta.slot_mapping, decodes, chunks)


def one_call_layers(model: CausalLM, backend: AttentionBackend) -> OneCallLayers | None:
    """The model's layers in one call, or None where any part of them is outside the kernels."""
    if not isinstance(backend, TorchAttention) or not backend.use_cpu_kernels or not len(model.layers):
        return None
    layers = [_layer_weights(layer) for layer in model.layers]
    if None in layers:
        return None
    attention, cfg = model.layers[0].self_attn, model.config
    decoder = cpu_kernels.cpu_kernels().CpuDecoder(
        attention.num_heads,
        attention.num_kv_heads,
        attention.head_dim,
        cfg.rms_norm_eps,
        attention.scale,
        model.rotary.cos,
        model.rotary.sin,
        layers,
    )
    return OneCallLayers(decoder)


def _layer_weights(layer: DecoderLayer) -> object | None:
    attention, mlp = layer.self_attn, layer.mlp
    if attention.all_reduce is not None or mlp.all_reduce is not None:
        return None
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    norms += [] if attention.q_norm is None else [attention.q_norm, attention.k_norm]
    projections = [_projection(p) for p in (attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj)]
    if None in projections or any(norm.weight.dtype != torch.bfloat16 for norm in norms):
        return None
    q_norm, k_norm = (None, None) if attention.q_norm is None else (norms[2].weight, norms[3].weight)
    return cpu_kernels.cpu_kernels().LayerWeights(norms[0].weight, norms[1].weight, q_norm, k_norm, *projections)


def _projection(linear: Linear) -> object | None:
    if linear.has_additions:
        return None
    kernels = cpu_kernels.cpu_kernels()
    if isinstance(linear, PairedLinear):
        return kernels.Projection(linear.paired_weight, None, linear.bias, linear.out_features)
    if isinstance(linear, Int8Linear) and linear.in_kernel:
        return kernels.Projection(linear.int8_weight, linear.weight_scale, linear.bias, linear.out_features)
    return None
