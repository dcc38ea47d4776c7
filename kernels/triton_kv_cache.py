"""Triton twins of kv_cache_ops.py: writing a step's new K/V into their cache slots, and copying
whole blocks for copy-on-write. Offsets are computed in int64: an H200's KV cache holds more
elements than an int32 can count."""

from __future__ import annotations

import torch

from argosy.kernels.triton_runtime import tl, triton
from argosy.kernels.triton_variants import launched


@launched
@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_k_tok, stride_v_tok, stride_slot,
    ROW: tl.constexpr, ROW_PAD: tl.constexpr,
):  # fmt: skip
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    offs = tl.arange(0, ROW_PAD)
    mask = offs < ROW
    k = tl.load(k_ptr + token * stride_k_tok + offs, mask=mask)
    v = tl.load(v_ptr + token * stride_v_tok + offs, mask=mask)
    dst = slot * stride_slot + offs
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv_constexprs(row: int) -> dict:
    return dict(ROW=row, ROW_PAD=triton.next_power_of_2(row))


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: [tokens, kv_heads, head_dim], each token's heads contiguous (a view of the qkv
    projection is fine); caches: [blocks, block_size, kv_heads, head_dim]."""
    num_tokens, kv_heads, head_dim = k.shape
    row = kv_heads * head_dim
    for t in (k, v):
        if t.stride(2) != 1 or t.stride(1) != head_dim:
            raise ValueError("write_kv needs each token's K/V heads contiguous")
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), v.stride(0), k_cache.stride(1), **write_kv_constexprs(row),
    )  # fmt: skip


@launched
@triton.jit
def _copy_blocks_kernel(cache_ptr, src_ptr, dst_ptr, stride_plane, BLOCK_ELEMS: tl.constexpr, CHUNK: tl.constexpr):
    pair = tl.program_id(0)
    plane = tl.program_id(1).to(tl.int64)  # one (layer, K or V) plane
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    base = cache_ptr + plane * stride_plane
    for start in range(0, BLOCK_ELEMS, CHUNK):
        offs = start + tl.arange(0, CHUNK)
        mask = offs < BLOCK_ELEMS
        # Each whole offset in int64: a block id times its size overflows int32 in a large cache.
        tl.store(base + (dst * BLOCK_ELEMS + offs), tl.load(base + (src * BLOCK_ELEMS + offs), mask=mask), mask=mask)


def copy_constexprs(block_elems: int) -> dict:
    return dict(BLOCK_ELEMS=block_elems, CHUNK=min(4096, triton.next_power_of_2(block_elems)), num_warps=8)


def copy_blocks(kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """kv_cache: [layers, 2, blocks, block_size, kv_heads, head_dim], contiguous."""
    layers, two = kv_cache.shape[:2]
    _copy_blocks_kernel[(len(src), layers * two)](
        kv_cache, src, dst, kv_cache.stride(1), **copy_constexprs(kv_cache[0, 0, 0].numel())
    )
