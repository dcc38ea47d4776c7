"""Decode steps through CUDA graphs. A decode step launches hundreds of small kernels, so on a
GPU the host, not the HBM, sets its pace; a graph replays the whole forward pass in one launch.

Graphs hold fixed shapes and addresses, so every captured batch size reads its inputs from one
set of static buffers (token ids, positions, slot mapping, block tables, context lengths) that
each step copies into, padded to the next captured size. Padding rows are decodes of the null
block (a cache block no sequence owns) with one key, so they write and read nothing real. The
largest size is captured first and all share one memory pool.

On CPU the same runner is the CUDA graphs' twin: "capture" does nothing and "replay" is an
eager call on the static buffers, so padding, bucketing and buffer reuse run in the tests."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from argosy.kernels.attention_backend import AttentionBackend, AttentionBatch
from argosy.server.engine_config import EngineConfig
from argosy.server.worker.model_inputs import SequenceChunk


def capture_sizes(configured: list[int], max_num_seqs: int) -> list[int]:
    """vLLM's default shape, 1, 2, 4, 8 and steps of 8, with max_num_seqs itself so that every
    decode batch has a graph; or the configured sizes. None above max_num_seqs."""
    sizes = configured or [1, 2, 4, *range(8, max_num_seqs, 8), max_num_seqs]
    return sorted({size for size in sizes if size <= max_num_seqs})


def graphs_enabled(config: EngineConfig, device: torch.device, backend: AttentionBackend) -> bool:
    """On CUDA, unless eager is enforced or the backend's step cannot be captured; on CPU only as
    the twin, when sizes are asked for."""
    if config.enforce_eager:
        return False
    return backend.captures_graphs if device.type == "cuda" else bool(config.cuda_graph_sizes)


@dataclass
class CapturedDecode:
    meta: Any  # the backend's metadata over the static buffers
    graph: torch.cuda.CUDAGraph | None  # None in the CPU twin
    hidden: torch.Tensor | None  # the graph's output buffer


class DecodeGraphs:
    def __init__(
        self,
        model: torch.nn.Module,
        backend: AttentionBackend,
        sizes: list[int],
        max_blocks_per_seq: int,
        block_size: int,
        max_model_len: int,
        device: torch.device,
    ):
        self.model, self.backend, self.sizes = model, backend, sizes
        self.block_size, self.max_model_len, self.device = block_size, max_model_len, device
        n = sizes[-1]
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.zeros(n, dtype=torch.long, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.long, device=device)
        self.query_start_loc = torch.arange(n + 1, dtype=torch.long, device=device)
        self.captured: dict[int, CapturedDecode] = {}
        self.kv_cache: torch.Tensor | None = None  # bound at capture
        self.null_block = 0

    def capture(self, kv_cache: torch.Tensor, null_block: int) -> None:
        """After the KV cache exists: graphs bind its address."""
        self.kv_cache, self.null_block = kv_cache, null_block
        self._pad_from(0)
        pool = None
        for size in reversed(self.sizes):
            meta = self.backend.metadata(self._batch(size))
            if self.device.type != "cuda":
                self.captured[size] = CapturedDecode(meta, None, None)
                continue
            self._forward(size, meta)  # compiles the kernels and settles the allocator first
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                hidden = self._forward(size, meta)
            pool = graph.pool()
            self.captured[size] = CapturedDecode(meta, graph, hidden)

    def fits(self, chunks: list[SequenceChunk]) -> bool:
        return len(chunks) <= self.sizes[-1] and all(len(chunk.token_ids) == 1 for chunk in chunks)

    def run(self, chunks: list[SequenceChunk]) -> torch.Tensor:
        """The final hidden states of a decode batch, one row per chunk."""
        n = len(chunks)
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        self._fill(chunks)
        self._pad_from(n, size)
        entry = self.captured[size]
        if entry.graph is None:
            # The twin: an eager call on the static buffers, with the captured metadata where a
            # graph would hold it fixed; the torch backend plans its tiles from the lengths, so
            # it plans them again.
            meta = entry.meta if self.backend.captures_graphs else self.backend.metadata(self._batch(size))
            return self._forward(size, meta)[:n]
        entry.graph.replay()
        return entry.hidden[:n]

    @torch.inference_mode()
    def _forward(self, size: int, meta: Any) -> torch.Tensor:
        return self.model(self.input_ids[:size], self.positions[:size], self.kv_cache, meta)

    def _batch(self, size: int) -> AttentionBatch:
        return AttentionBatch(
            self.slot_mapping[:size],
            self.query_start_loc[: size + 1],
            self.seq_lens[:size],
            self.block_tables[:size],
            self.block_size,
            [1] * size,
            self.max_model_len,
        )

    def _fill(self, chunks: list[SequenceChunk]) -> None:
        n = len(chunks)
        bs = self.block_size
        positions = [chunk.start for chunk in chunks]
        width = max(len(chunk.block_table) for chunk in chunks)
        tables = [chunk.block_table + [self.null_block] * (width - len(chunk.block_table)) for chunk in chunks]
        host = torch.tensor(
            [
                [chunk.token_ids[0] for chunk in chunks],
                positions,
                [table[p // bs] * bs + p % bs for table, p in zip(tables, positions)],
                [p + 1 for p in positions],
            ],
            dtype=torch.long,
        )
        self.input_ids[:n].copy_(host[0], non_blocking=True)
        self.positions[:n].copy_(host[1], non_blocking=True)
        self.slot_mapping[:n].copy_(host[2], non_blocking=True)
        self.seq_lens[:n].copy_(host[3], non_blocking=True)
        self.block_tables[:n, :width].copy_(torch.tensor(tables, dtype=torch.long), non_blocking=True)

    def _pad_from(self, n: int, size: int | None = None) -> None:
        """Rows n..size decode the null block's first slot."""
        end = self.sizes[-1] if size is None else size
        self.input_ids[n:end] = 0
        self.positions[n:end] = 0
        self.slot_mapping[n:end] = self.null_block * self.block_size
        self.seq_lens[n:end] = 1
        self.block_tables[n:end, 0] = self.null_block
