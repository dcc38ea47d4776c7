"""Paged attention over a flattened batch, in pure PyTorch: the CPU path and the
reference the Triton kernels must match.

A step's query tokens are flattened into one [tokens, heads, head_dim] tensor, decodes and
prefill chunks of many sequences side by side, with no padding of the batch. Each sequence's
keys live in the paged cache, reached through its block table. Attention runs in *tiles*: a
tile is up to `tile_size` consecutive query tokens of one sequence together with the cache
slots of every key they may see. Decodes are tiles of one query; a prefill chunk is split
into tiles of up to 64. Tiles of a kind are batched into one matmul, so there is no Python
loop over sequences or layers; the tile plan is built once per step and reused by every layer.

On CPU the C++ kernels read the cache in place instead: the decodes cpu_attention.cpp's
(`DecodeRows`), every query of several tokens cpu_chunk_attention.cpp's (`ChunkRows`), and so
does a step of one sequence, its one token included: one stream's decodes then get exactly the
arithmetic its speculative verifications get, as the chunk kernel's rows do not depend on each
other (it is as fast as the decode kernel on one sequence). The tiles here stay the reference
they are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from argosy.kernels import cpu_kernels

PREFILL_TILE = 64


@dataclass
class AttentionTiles:
    q_index: torch.Tensor  # [tiles, tile_size] flat token index of each query row (0 on padding)
    row_valid: torch.Tensor  # [tiles, tile_size] which query rows are real tokens
    kv_slots: torch.Tensor  # [tiles, max_keys] cache slot of each key a tile may see
    mask: torch.Tensor  # [tiles, tile_size, max_keys] causal visibility of key j to row i


@dataclass
class DecodeRows:
    """The decodes of a step, for the CPU kernel: one query token per sequence."""

    q_index: torch.Tensor  # [decodes] flat token index of each one's query
    block_tables: torch.Tensor  # [decodes, max_blocks]
    seq_lens: torch.Tensor  # [decodes]


@dataclass
class ChunkRows:
    """The queries of several tokens of a step, for the CPU kernel: each is consecutive new tokens
    of one sequence (a prompt chunk, a chunk after a cached prefix, a speculative step's positions)."""

    q_start: torch.Tensor  # [chunks] flat token index of each one's first query
    q_len: torch.Tensor  # [chunks]
    seq_lens: torch.Tensor  # [chunks] keys in the cache after this step, its own included
    block_tables: torch.Tensor  # [chunks, max_blocks]


@dataclass
class AttentionMetadata:
    """What one step's attention needs; built once per step by the model runner."""

    slot_mapping: torch.Tensor  # [tokens] cache slot where each new token's K/V is written
    query_start_loc: torch.Tensor  # [seqs + 1] start of each sequence's tokens in the batch
    seq_lens: torch.Tensor  # [seqs] tokens in the cache for each sequence after this step
    block_tables: torch.Tensor  # [seqs, max_blocks] block ids, padded with 0
    block_size: int
    tiles: list[AttentionTiles]
    decodes: DecodeRows | None = None  # set when the CPU kernels attend the decodes
    chunks: ChunkRows | None = None  # and the queries of several tokens
    # (first token, length) of each prompt chunk with nothing before it in the cache: its keys
    # are its own new ones, so it is attended directly, causally, without a gather.
    fresh_prefills: list[tuple[int, int]] = field(default_factory=list)


def build_metadata(
    slot_mapping: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    use_cpu_kernels: bool = False,
    direct_prefill: bool = False,
) -> AttentionMetadata:
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    tiles, decodes, chunks, fresh = [], None, None, []
    tiled_prefill = q_lens > 1
    if direct_prefill:
        is_fresh = tiled_prefill & (seq_lens == q_lens)
        fresh_idx = is_fresh.nonzero().flatten()
        fresh = list(zip(query_start_loc[fresh_idx].tolist(), q_lens[fresh_idx].tolist()))
        tiled_prefill &= ~is_fresh
    if use_cpu_kernels and len(q_lens) == 1 and not fresh:  # one stream: the chunk kernel (see above)
        tiled_prefill = q_lens > 0
    for decode in (True, False):  # tiles of one query for decodes, of up to PREFILL_TILE for prefills
        idx = ((q_lens == 1) & ~tiled_prefill if decode else tiled_prefill).nonzero().flatten()
        if not idx.numel():
            continue
        if use_cpu_kernels and decode:
            decodes = DecodeRows(query_start_loc[idx], block_tables[idx].contiguous(), seq_lens[idx])
        elif use_cpu_kernels:
            chunks = ChunkRows(query_start_loc[idx], q_lens[idx], seq_lens[idx], block_tables[idx].contiguous())
        else:
            tile_size = 1 if decode else min(PREFILL_TILE, _next_pow2(int(q_lens[idx].max())))
            tiles.append(
                _plan_tiles(query_start_loc[idx], q_lens[idx], seq_lens[idx], block_tables[idx], block_size, tile_size)
            )
    return AttentionMetadata(
        slot_mapping, query_start_loc, seq_lens, block_tables, block_size, tiles, decodes, chunks, fresh
    )


def _plan_tiles(
    q_start: torch.Tensor,
    q_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_size: int,
    tile_size: int,
) -> AttentionTiles:
    device = q_start.device
    n_tiles = (q_lens + tile_size - 1) // tile_size
    tile_seq = torch.repeat_interleave(torch.arange(len(q_lens), device=device), n_tiles)
    first_tile = torch.repeat_interleave(torch.cumsum(n_tiles, 0) - n_tiles, n_tiles)
    tile_no = torch.arange(len(tile_seq), device=device) - first_tile
    row = tile_no[:, None] * tile_size + torch.arange(tile_size, device=device)[None, :]
    row_valid = row < q_lens[tile_seq][:, None]
    q_index = torch.where(row_valid, q_start[tile_seq][:, None] + row, 0)
    q_pos = (seq_lens - q_lens)[tile_seq][:, None] + row
    n_keys = torch.minimum(q_pos[:, -1] + 1, seq_lens[tile_seq])
    keys = torch.arange(int(n_keys.max()), device=device)
    kv_slots = block_tables[tile_seq][:, keys // block_size] * block_size + keys % block_size
    mask = (keys[None, None, :] <= q_pos[:, :, None]) & row_valid[:, :, None]
    mask[:, :, 0] |= ~row_valid  # padding rows see one key, so their softmax is not NaN
    return AttentionTiles(q_index, row_valid, kv_slots, mask)


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: [tokens, heads, head_dim]; caches: [blocks, block_size, kv_heads, head_dim].
    Returns [tokens, heads * head_dim]. The new tokens' K/V must already be in the cache; k, v
    ([tokens, kv_heads, head_dim], the same new K/V) are needed when meta has fresh prefills."""
    num_tokens, num_heads, head_dim = q.shape
    out = q.new_empty(num_tokens, num_heads * head_dim)
    if meta.decodes is not None:
        d = meta.decodes
        cpu_kernels.paged_decode_attention(
            q.contiguous(), k_cache, v_cache, d.q_index, d.block_tables, d.seq_lens, scale, out.view(q.shape)
        )
    if meta.chunks is not None:
        c = meta.chunks
        cpu_kernels.paged_chunk_attention(
            q.contiguous(), k_cache, v_cache, c.q_start, c.q_len, c.seq_lens, c.block_tables, scale, out.view(q.shape)
        )
    for start, length in meta.fresh_prefills:
        rows = slice(start, start + length)
        # [1, heads, tokens, head_dim]: with the batch dimension PyTorch takes its fused CPU kernel.
        o = torch.nn.functional.scaled_dot_product_attention(
            q[rows].transpose(0, 1)[None],
            k[rows].transpose(0, 1)[None],
            v[rows].transpose(0, 1)[None],
            is_causal=True,
            scale=scale,
            enable_gqa=True,
        )
        out[rows] = o[0].transpose(0, 1).reshape(length, num_heads * head_dim)
    if not meta.tiles:
        return out
    k_flat = k_cache.flatten(0, 1)
    v_flat = v_cache.flatten(0, 1)
    for tiles in meta.tiles:
        o = _attend_tiles(q, k_flat, v_flat, tiles, scale)
        out[tiles.q_index[tiles.row_valid]] = o[tiles.row_valid.flatten()]
    return out


def _attend_tiles(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, tiles: AttentionTiles, scale: float
) -> torch.Tensor:
    n, tile_size = tiles.q_index.shape
    n_keys = tiles.kv_slots.shape[1]
    _, num_heads, head_dim = q.shape
    kv_heads = k_flat.shape[1]
    group = num_heads // kv_heads
    # Queries sharing a KV head are stacked as rows, so K and V are never repeated (GQA).
    qt = q[tiles.q_index].view(n, tile_size, kv_heads, group, head_dim)
    qt = qt.permute(0, 2, 3, 1, 4).reshape(n, kv_heads, group * tile_size, head_dim)
    slots = tiles.kv_slots.flatten()
    k = k_flat.index_select(0, slots).view(n, n_keys, kv_heads, head_dim).transpose(1, 2)
    v = v_flat.index_select(0, slots).view(n, n_keys, kv_heads, head_dim).transpose(1, 2)
    if tile_size == 1:
        scores = torch.matmul(qt, k.transpose(-1, -2)).float() * scale
        scores = scores.view(n, kv_heads, group, tile_size, n_keys)
        scores.masked_fill_(~tiles.mask[:, None, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype).view(n, kv_heads, group * tile_size, n_keys)
        o = torch.matmul(probs, v)
    else:
        mask = tiles.mask[:, None, None].expand(n, 1, group, tile_size, n_keys)
        o = torch.nn.functional.scaled_dot_product_attention(
            qt, k, v, attn_mask=mask.reshape(n, 1, group * tile_size, n_keys), scale=scale
        )
    o = o.view(n, kv_heads, group, tile_size, head_dim).permute(0, 3, 1, 2, 4)
    return o.reshape(n * tile_size, num_heads * head_dim)
