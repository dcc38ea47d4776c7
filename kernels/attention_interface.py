"""The interface every attention backend implements (attention_backend.py's TorchAttention,
triton_backend.py's TritonAttention), and the batch its metadata is built from; apart from both,
so that neither backend imports the module that chooses between them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch

from argosy.kernels.elementwise import LayerKernels


@dataclass
class AttentionBatch:
    """What a step's metadata is built from: the batch on the device, and the facts a builder
    needs on the host without reading the device back."""

    slot_mapping: torch.Tensor  # [tokens] cache slot of each new token's K/V
    query_start_loc: torch.Tensor  # [seqs + 1]
    seq_lens: torch.Tensor  # [seqs] keys in the cache after this step
    block_tables: torch.Tensor  # [seqs, max_blocks]
    block_size: int
    q_lens: list[int]  # new tokens per sequence
    max_seq_len: int  # an upper bound of seq_lens


class AttentionBackend(Protocol):
    name: str
    kernels: LayerKernels
    captures_graphs: bool  # its metadata and forward pass never read the device back
    compiles_kernels: bool  # its kernels compile at their first launch of each variant (Triton's)

    def metadata(self, batch: AttentionBatch) -> Any: ...

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_cache: torch.Tensor, meta: Any, scale: float
    ) -> torch.Tensor:
        """q: [tokens, heads, head_dim]; k, v: [tokens, kv_heads, head_dim]; layer_cache:
        [2, blocks, block_size, kv_heads, head_dim]. Returns [tokens, heads * head_dim]."""
        ...

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None: ...
