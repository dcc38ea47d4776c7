"""ModelRunner: owns the model and the KV cache on the device. A step is two parts: its inputs
are prepared (model_inputs.py), then one forward pass returns the logits of the sequences to
sample. The memory-profiling pass goes through the same two parts."""

from __future__ import annotations

import dataclasses

import torch

from argosy.kernels.kv_cache_ops import copy_blocks
from argosy.server.engine.scheduler import SchedulerOutput
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.model_inputs import ModelInputs, SequenceChunk, chunks_of, prepare_inputs


class ModelRunner:
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_model_len: int, block_size: int):
        self.cfg, self.dtype, self.device, self.block_size = cfg, dtype, device, block_size
        self.model = load_model(cfg, dtype, device, max_model_len)
        self.kv_cache = self._empty_cache(0)

    def _empty_cache(self, num_blocks: int) -> torch.Tensor:
        # Zeroed, not empty: masked-out slots are still multiplied by zero probabilities,
        # and uninitialised memory could hold NaN.
        cfg = self.cfg
        return torch.zeros(
            cfg.num_layers,
            2,
            num_blocks,
            self.block_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            dtype=self.dtype,
            device=self.device,
        )

    def allocate_kv_cache(self, num_blocks: int) -> None:
        self.kv_cache = self._empty_cache(num_blocks)

    def execute(self, out: SchedulerOutput) -> torch.Tensor:
        """Runs the step; returns float32 logits, one row per scheduled sequence that
        `completes`, in schedule order."""
        if out.blocks_to_copy:
            src, dst = zip(*out.blocks_to_copy)
            copy_blocks(self.kv_cache, torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device))
        return self.forward(prepare_inputs(chunks_of(out), self.block_size, self.device), self.kv_cache)

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs, kv_cache: torch.Tensor) -> torch.Tensor:
        hidden = self.model(inputs.input_ids, inputs.positions, kv_cache, inputs.attention)
        return self.model.compute_logits(hidden[inputs.logits_rows])

    def profile_peak_bytes(self, num_tokens: int, num_logits: int) -> int | None:
        """Runs the largest step the scheduler can produce, a prefill of num_tokens with logits
        for num_logits rows, into a scratch cache, and returns the device's peak memory:
        weights plus activations. None on CPU, whose KV cache is sized by bytes alone; the
        pass itself runs anyway."""
        num_blocks = -(-num_tokens // self.block_size)
        prefill = SequenceChunk([0] * num_tokens, 0, list(range(num_blocks)), sample=True)
        inputs = prepare_inputs([prefill], self.block_size, self.device)
        inputs = dataclasses.replace(inputs, logits_rows=torch.arange(min(num_logits, num_tokens), device=self.device))
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.forward(inputs, self._empty_cache(num_blocks))
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.max_memory_allocated(self.device)
