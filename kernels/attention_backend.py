"""The attention backends. The model calls one interface: `metadata` once per step (every layer
reuses what it builds), `forward` once per layer (write the new K/V into the cache, then attend),
`copy_blocks` for copy-on-write, and `kernels` for the norms, rotary and activation. `torch` is
the PyTorch path (on CPU its attention goes to C++ kernels that read the cache in place, one
for decodes and one for queries of several tokens, and its bfloat16 norms, rotary and
activation to C++ kernels too; without
it, the pure-PyTorch reference); `triton` runs the Triton kernels
(compiled on CUDA, interpreted on CPU). Triton is imported only when its backend is chosen."""

from __future__ import annotations

import torch

from argosy.kernels import cpu_kernels, kv_cache_ops
from argosy.kernels.attention_interface import AttentionBackend, AttentionBatch
from argosy.kernels.cpu_elementwise import CPU_KERNELS
from argosy.kernels.elementwise import TORCH_KERNELS
from argosy.kernels.paged_attention import AttentionMetadata, build_metadata, paged_attention


class TorchAttention:
    name = "torch"
    captures_graphs = False  # the tile plan reads context lengths back to the host
    compiles_kernels = False  # its C++ kernels are built before the model loads

    def __init__(self, use_cpu_kernels: bool = False):
        # Attention and bfloat16 elementwise ops through the C++ kernels; else all through the reference.
        self.use_cpu_kernels = use_cpu_kernels
        self.kernels = CPU_KERNELS if use_cpu_kernels else TORCH_KERNELS

    def metadata(self, batch: AttentionBatch) -> AttentionMetadata:
        return build_metadata(
            batch.slot_mapping,
            batch.query_start_loc,
            batch.seq_lens,
            batch.block_tables,
            batch.block_size,
            self.use_cpu_kernels,
            # The chunk kernel beats PyTorch's fused attention on fresh prompts too (2-4x).
            direct_prefill=not self.use_cpu_kernels,
        )

    def forward(self, q, k, v, layer_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        write_kv = cpu_kernels.write_kv if self.use_cpu_kernels else kv_cache_ops.write_kv
        write_kv(k, v, layer_cache[0], layer_cache[1], meta.slot_mapping)
        return paged_attention(q, layer_cache[0], layer_cache[1], meta, scale, k, v)

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        kv_cache_ops.copy_blocks(kv_cache, src, dst)


def select_backend(name: str, device: torch.device, num_kv_heads: int) -> AttentionBackend:
    """`auto` is Triton on CUDA and PyTorch elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        return TorchAttention(use_cpu_kernels=device.type == "cpu" and cpu_kernels.cpu_kernels() is not None)
    from argosy.kernels.triton_backend import TritonAttention

    return TritonAttention(device, num_kv_heads)
