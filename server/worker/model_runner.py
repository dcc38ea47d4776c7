"""ModelRunner: owns the model and the KV cache on the device; turns a SchedulerOutput
into one flattened forward pass and returns the logits of the sequences to sample."""
from __future__ import annotations

import torch

from argosy.kernels.kv_cache_ops import copy_blocks
from argosy.kernels.paged_attention import build_metadata
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.loader import load_model
from argosy.server.engine.scheduler import SchedulerOutput


class ModelRunner:
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_model_len: int,
                 block_size: int):
        self.cfg, self.dtype, self.device, self.block_size = cfg, dtype, device, block_size
        self.model = load_model(cfg, dtype, device, max_model_len)
        self.kv_cache = self._empty_cache(0)

    def _empty_cache(self, num_blocks: int) -> torch.Tensor:
        # Zeroed, not empty: masked-out slots are still multiplied by zero probabilities,
        # and uninitialised memory could hold NaN.
        cfg = self.cfg
        return torch.zeros(cfg.num_layers, 2, num_blocks, self.block_size, cfg.num_kv_heads, cfg.head_dim,
                           dtype=self.dtype, device=self.device)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_cache = self._empty_cache(num_blocks)

    @torch.inference_mode()
    def profile_peak_bytes(self, num_tokens: int, num_logits: int) -> int | None:
        """Runs the largest step the scheduler can produce (a prefill of num_tokens, logits
        for num_logits rows) and returns the device's peak memory: weights plus activations.
        None on CPU, whose KV cache is sized by bytes alone; the pass itself runs anyway."""
        num_blocks = -(-num_tokens // self.block_size)
        cache = self._empty_cache(num_blocks)
        positions = torch.arange(num_tokens, device=self.device)
        meta = build_metadata(positions, torch.tensor([0, num_tokens], device=self.device),
                              torch.tensor([num_tokens], device=self.device),
                              torch.arange(num_blocks, device=self.device)[None, :], self.block_size)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        hidden = self.model(torch.zeros(num_tokens, dtype=torch.long, device=self.device), positions, cache, meta)
        self.model.compute_logits(hidden[:num_logits])
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)

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
