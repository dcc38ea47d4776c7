"""Writing into and copying within the paged KV cache."""

from __future__ import annotations

import torch


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [tokens, kv_heads, head_dim] go to the flat cache slots in slot_mapping."""
    k_cache.flatten(0, 1).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
    v_cache.flatten(0, 1).index_copy_(0, slot_mapping, v.to(v_cache.dtype))


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy-on-write: whole blocks src[i] -> dst[i] in every layer's K and V at once.
    kv_cache: [layers, 2, blocks, block_size, kv_heads, head_dim]."""
    kv_cache[:, :, dst] = kv_cache[:, :, src]
