"""Decode steps through CUDA graphs. A decode step launches hundreds of small kernels, so on a
GPU the host, not the HBM, sets its pace; a graph replays the whole forward pass in one launch.

Graphs hold fixed shapes and addresses, so every captured batch size reads its inputs from one
set of static buffers (StaticInputs: every field of step_inputs.FIELDS) that each step copies
into, padded to the next captured size. Padding rows are decodes of the null block (a cache
block no sequence owns) with one key, so they write and read nothing real. The largest size is
captured first and all share one memory pool. With LoRA on, each size is captured twice: with
the adapters' products, which read each token's slot from its static buffer, and without, for
batches in which no sequence has an adapter (they pay nothing for LoRA being on).

On CPU the same runner is the CUDA graphs' twin: "capture" does nothing and "replay" is an
eager call on the static buffers, so padding, bucketing and buffer reuse run in the tests."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from argosy.kernels.attention_backend import AttentionBackend
from argosy.kernels.lora_ops import LoRABatch
from argosy.server.engine_config import EngineConfig
from argosy.server.lora.device_weights import LoRAContext
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.step_inputs import SequenceChunk, StaticInputs, host_inputs


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
        lora: LoRAContext | None = None,
    ):
        self.model, self.backend, self.sizes = model, backend, sizes
        self.block_size, self.max_model_len, self.device = block_size, max_model_len, device
        self.inputs = StaticInputs(sizes[-1], max_blocks_per_seq, block_size, device)
        self.adapters = lora is not None  # captured with the adapters' products too
        self.lora = lora or LoRAContext()  # the context the model's LoRA layers read
        self.captured: dict[tuple[int, bool], CapturedDecode] = {}  # by (size, with adapters)
        self.kv_cache: torch.Tensor | None = None  # bound at capture

    def capture(self, kv_cache: torch.Tensor, null_block: int) -> None:
        """After the KV cache exists: graphs bind its address."""
        self.kv_cache, self.inputs.null_block = kv_cache, null_block
        self.inputs.pad(0, self.sizes[-1])
        pool = None
        for size in reversed(self.sizes):
            meta = self.backend.metadata(self.inputs.batch(size, self.max_model_len))
            for adapters in (False, True) if self.adapters else (False,):
                if self.device.type != "cuda":
                    self.captured[size, adapters] = CapturedDecode(meta, None, None)
                    continue
                # Captured with every slot -1: the products are in the graph, each token's slot is read at replay.
                runs = [] if adapters else None
                self._forward(size, meta, runs)  # compiles the kernels and settles the allocator first
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._forward(size, meta, runs)
                pool = graph.pool()
                self.captured[size, adapters] = CapturedDecode(meta, graph, hidden)

    def release(self) -> None:
        """Forgets the graphs and the KV cache they bound (asleep); capture binds them anew."""
        self.captured.clear()
        self.kv_cache = None

    def fits(self, chunks: list[SequenceChunk]) -> bool:
        return len(chunks) <= self.sizes[-1] and all(len(chunk.token_ids) == 1 for chunk in chunks)

    def run(self, chunks: list[SequenceChunk], tables: BlockTables) -> torch.Tensor:
        """The final hidden states of a decode batch, one row per chunk; `tables` holds their
        block tables at their table_row."""
        n = len(chunks)
        size = self.sizes[bisect.bisect_left(self.sizes, n)]
        host = host_inputs(chunks, self.block_size)
        self.inputs.fill(host, tables, size)
        entry = self.captured[size, bool(host.lora_runs)]
        if entry.graph is None:
            # The twin: an eager call on the static buffers, with the captured metadata where a
            # graph would hold it fixed; the torch backend plans its tiles from the lengths, so
            # it plans them again.
            meta = (
                entry.meta
                if self.backend.captures_graphs
                else self.backend.metadata(self.inputs.batch(size, self.max_model_len))
            )
            return self._forward(size, meta, host.lora_runs or None)[:n]
        entry.graph.replay()
        return entry.hidden[:n]

    @torch.inference_mode()
    def _forward(self, size: int, meta: Any, lora_runs: list[tuple[int, int, int]] | None = None) -> torch.Tensor:
        """The forward pass on the static buffers; with `lora_runs` (None: no adapters), the
        adapters' products too."""
        inputs = self.inputs
        batch = None if lora_runs is None else LoRABatch(inputs.field("lora_slots", size), lora_runs)
        with self.lora.serving(batch):
            return self.model(inputs.field("input_ids", size), inputs.field("positions", size), self.kv_cache, meta)
