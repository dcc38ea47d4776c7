"""ModelRunner: owns the model and the KV cache on the device; turns a SchedulerOutput
into one flattened forward pass and returns the logits of the sequences to sample."""
from __future__ import annotations

import torch

from argosy.kernels.kv_cache_ops import copy_blocks
from argosy.kernels.paged_attention import build_metadata
from argosy.server.model_config import ModelConfig
from argosy.server.models.loader import load_model
from argosy.server.scheduler import SchedulerOutput


def kv_bytes_per_block(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * cfg.head_dim * dtype.itemsize


class ModelRunner:
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_model_len: int,
                 block_size: int, num_blocks: int):
        self.device = device
        self.block_size = block_size
        self.model = load_model(cfg, dtype, device, max_model_len)
        # Zeroed, not empty: masked-out slots are still multiplied by zero probabilities,
        # and uninitialised memory could hold NaN.
        self.kv_cache = torch.zeros(cfg.num_layers, 2, num_blocks, block_size, cfg.num_kv_heads,
                                    cfg.head_dim, dtype=dtype, device=device)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Runs the step; returns float32 logits, one row per scheduled sequence that
        `completes`, in schedule order."""
        if out.blocks_to_copy:
            src, dst = zip(*out.blocks_to_copy)
            copy_blocks(self.kv_cache, torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device))
        token_ids: list[int] = []
        starts, lens, tables = [], [], []
        for item in out.scheduled:
            seq, start = item.seq, item.seq.num_computed_tokens
            token_ids.extend(seq.token_ids[start:start + item.num_new_tokens])
            starts.append(start)
            lens.append(item.num_new_tokens)
            tables.append(seq.block_table)
        ids = torch.tensor(token_ids, dtype=torch.long)
        q_lens = torch.tensor(lens, dtype=torch.long)
        ctx_start = torch.tensor(starts, dtype=torch.long)
        query_start_loc = torch.zeros(len(lens) + 1, dtype=torch.long)
        torch.cumsum(q_lens, 0, out=query_start_loc[1:])
        seq_of_token = torch.repeat_interleave(torch.arange(len(lens)), q_lens)
        positions = ctx_start[seq_of_token] + torch.arange(len(token_ids)) - query_start_loc[seq_of_token]
        block_tables = _pad(tables)
        slots = block_tables[seq_of_token, positions // self.block_size] * self.block_size + positions % self.block_size
        completes = [i for i, item in enumerate(out.scheduled) if item.completes]
        logits_rows = query_start_loc[1:][completes] - 1
        dev = self.device
        meta = build_metadata(slots.to(dev), query_start_loc.to(dev), (ctx_start + q_lens).to(dev),
                              block_tables.to(dev), self.block_size)
        hidden = self.model(ids.to(dev), positions.to(dev), self.kv_cache, meta)
        return self.model.compute_logits(hidden[logits_rows.to(dev)])


def _pad(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
