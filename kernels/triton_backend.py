"""The Triton attention backend: decodes (one new token) go to the split-KV decode kernel,
everything else to the prefill/extend kernel, both reading the same paged cache. Which
sequences go where is settled on the host when the step is built, so that a CUDA graph can
hold the metadata of a decode batch fixed while its buffers change."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from argosy.kernels import triton_kv_cache
from argosy.kernels.attention_interface import AttentionBatch
from argosy.kernels.triton_attention_decode import decode_attention, num_splits_for
from argosy.kernels.triton_attention_prefill import prefill_attention
from argosy.kernels.triton_elementwise import TRITON_KERNELS


@dataclass
class TritonAttentionMetadata:
    batch: AttentionBatch
    decode_seqs: torch.Tensor  # sequences with one new token
    decode_tokens: torch.Tensor  # the row of that token in the batch
    prefill_seqs: torch.Tensor
    max_prefill_len: int
    num_splits: int


class TritonAttention:
    name = "triton"
    kernels = TRITON_KERNELS
    captures_graphs = True
    compiles_kernels = True

    def __init__(self, device: torch.device, num_kv_heads: int):
        self.device, self.num_kv_heads = device, num_kv_heads
        # Two programs per SM hide the latency of the block-table gathers; the interpreter
        # runs programs one by one, so there more of them only costs time.
        sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 0
        self.target_programs = max(1, 2 * sms)

    def metadata(self, batch: AttentionBatch) -> TritonAttentionMetadata:
        decodes = [i for i, n in enumerate(batch.q_lens) if n == 1]
        prefills = [i for i, n in enumerate(batch.q_lens) if n > 1]
        decode_seqs = torch.tensor(decodes, dtype=torch.long).to(self.device)
        return TritonAttentionMetadata(
            batch,
            decode_seqs,
            batch.query_start_loc[decode_seqs],
            torch.tensor(prefills, dtype=torch.long).to(self.device),
            max((batch.q_lens[i] for i in prefills), default=0),
            num_splits_for(len(decodes), self.num_kv_heads, batch.max_seq_len, self.target_programs),
        )

    def forward(self, q, k, v, layer_cache, meta: TritonAttentionMetadata, scale: float) -> torch.Tensor:
        k_cache, v_cache = layer_cache[0], layer_cache[1]
        b = meta.batch
        triton_kv_cache.write_kv(k, v, k_cache, v_cache, b.slot_mapping)
        out = q.new_empty(q.shape[0], q.shape[1] * q.shape[2])
        decode_attention(
            q, k_cache, v_cache, b.block_tables, b.seq_lens, meta.decode_seqs, meta.decode_tokens,
            out, scale, meta.num_splits,
        )  # fmt: skip
        prefill_attention(
            q, k_cache, v_cache, b.block_tables, b.seq_lens, b.query_start_loc, meta.prefill_seqs,
            meta.max_prefill_len, out, scale,
        )  # fmt: skip
        return out

    def copy_blocks(self, kv_cache: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
        triton_kv_cache.copy_blocks(kv_cache, src, dst)
