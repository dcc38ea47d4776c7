"""Decode steps through CUDA graphs. A decode step launches hundreds of small kernels, so on a
GPU the host, not the HBM, sets its pace; a graph replays the whole forward pass in one launch.

Graphs hold fixed shapes and addresses, so every captured batch size reads its inputs from one
set of static buffers (StaticInputs: every field of step_inputs.FIELDS) that each step copies
into, padded to the next captured size. Padding rows are sequences of the null block (a cache
block no sequence owns) that see only their own keys, so they write and read nothing real.
With speculative decoding, a step whose sequences each verify k drafts (k + 1 tokens each, the
common case at the low load where speculation runs) has graphs of its own, one per size up to
the first at or past the speculation's batch-size limit, over buffers of that width; a step of
mixed widths runs eagerly. The largest shape is captured first and all share one memory pool.
With LoRA on, each shape is captured twice: with the adapters' products, which read each
token's slot from its static buffer, and without, for batches in which no sequence has an
adapter (they pay nothing for LoRA being on).

On CPU the same runner is the CUDA graphs' twin: "capture" does nothing and "replay" is an
eager call on the static buffers, so padding, bucketing and buffer reuse run in the tests."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

import torch

from argosy.kernels.attention_interface import AttentionBackend
from argosy.kernels.lora_ops import LoRABatch
from argosy.server.engine_config import EngineConfig
from argosy.server.lora.device_weights import LoRAContext
from argosy.server.spec_decode.config import SpeculativeConfig
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


def capture_shapes(sizes: list[int], speculative: SpeculativeConfig | None) -> list[tuple[int, int]]:
    """(sequences, tokens each) of every graph: decodes of each size; with speculation,
    verifications of k drafts in batches up to the first size that reaches its batch-size limit
    (it speculates with no more running)."""
    shapes = [(size, 1) for size in sizes]
    if speculative is not None:
        limit = next((size for size in sizes if size >= speculative.disable_by_batch_size), sizes[-1])
        shapes += [(size, speculative.num_speculative_tokens + 1) for size in sizes if size <= limit]
    return shapes


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
        shapes: list[tuple[int, int]],
        max_blocks_per_seq: int,
        block_size: int,
        max_model_len: int,
        device: torch.device,
        lora: LoRAContext | None = None,
    ):
        self.model, self.backend = model, backend
        self.block_size, self.max_model_len, self.device = block_size, max_model_len, device
        self.sizes = sorted({size for size, width in shapes if width == 1})  # the decode batch sizes
        self.sizes_of = {w: sorted(size for size, width in shapes if width == w) for _, w in shapes}
        self.inputs = {
            w: StaticInputs(sizes[-1], max_blocks_per_seq, block_size, device, w) for w, sizes in self.sizes_of.items()
        }
        self.adapters = lora is not None  # captured with the adapters' products too
        self.lora = lora or LoRAContext()  # the context the model's LoRA layers read
        self.captured: dict[tuple[int, int, bool], CapturedDecode] = {}  # by (size, width, with adapters)
        self.kv_cache: torch.Tensor | None = None  # bound at capture

    @property
    def max_tokens(self) -> int:
        """The most tokens one graph runs: its activations are what the memory pool keeps."""
        return max(sizes[-1] * w for w, sizes in self.sizes_of.items())

    def capture(self, kv_cache: torch.Tensor, null_block: int) -> None:
        """After the KV cache exists: graphs bind its address."""
        self.kv_cache = kv_cache
        for inputs in self.inputs.values():
            inputs.null_block = null_block
            inputs.pad(0, self.sizes_of[inputs.width][-1])
        pool = None
        shapes = [(size, w) for w, sizes in self.sizes_of.items() for size in sizes]
        for size, w in sorted(shapes, key=lambda shape: shape[0] * shape[1], reverse=True):
            meta = self.backend.metadata(self.inputs[w].batch(size, self.max_model_len))
            for adapters in (False, True) if self.adapters else (False,):
                if self.device.type != "cuda":
                    self.captured[size, w, adapters] = CapturedDecode(meta, None, None)
                    continue
                # Captured with every slot -1: the products are in the graph, each token's slot is read at replay.
                runs = [] if adapters else None
                self._forward(size, w, meta, runs)  # compiles the kernels and settles the allocator first
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    hidden = self._forward(size, w, meta, runs)
                pool = graph.pool()
                self.captured[size, w, adapters] = CapturedDecode(meta, graph, hidden)

    def release(self) -> None:
        """Forgets the graphs and the KV cache they bound (asleep); capture binds them anew."""
        self.captured.clear()
        self.kv_cache = None

    def fits(self, chunks: list[SequenceChunk]) -> bool:
        """Whether a graph runs these chunks: as many as a captured size, all of one captured width."""
        width = _width(chunks)
        sizes = self.sizes_of.get(width)
        return sizes is not None and len(chunks) <= sizes[-1] and all(len(c.token_ids) == width for c in chunks)

    def run(self, chunks: list[SequenceChunk], tables: BlockTables) -> torch.Tensor:
        """The final hidden states of the rows the batch samples (each sampling chunk's last
        token and its drafts), in order; `tables` holds their block tables at their table_row."""
        width = _width(chunks)
        sizes, inputs = self.sizes_of[width], self.inputs[width]
        size = sizes[bisect.bisect_left(sizes, len(chunks))]
        host = host_inputs(chunks, self.block_size)
        inputs.fill(host, tables, size)
        rows = torch.tensor(host.logits_rows, dtype=torch.long, device=self.device)
        entry = self.captured[size, width, bool(host.lora_runs)]
        if entry.graph is None:
            # The twin: an eager call on the static buffers, with the captured metadata where a
            # graph would hold it fixed; the torch backend plans its tiles from the lengths, so
            # it plans them again.
            meta = (
                entry.meta
                if self.backend.captures_graphs
                else self.backend.metadata(inputs.batch(size, self.max_model_len))
            )
            return self._forward(size, width, meta, host.lora_runs or None)[rows]
        entry.graph.replay()
        return entry.hidden[rows]

    @torch.inference_mode()
    def _forward(
        self, size: int, width: int, meta: Any, lora_runs: list[tuple[int, int, int]] | None = None
    ) -> torch.Tensor:
        """The forward pass on the static buffers of `width`; with `lora_runs` (None: no
        adapters), the adapters' products too."""
        inputs = self.inputs[width]
        batch = None if lora_runs is None else LoRABatch(inputs.field("lora_slots", size), lora_runs)
        with self.lora.serving(batch):
            return self.model(inputs.field("input_ids", size), inputs.field("positions", size), self.kv_cache, meta)


def _width(chunks: list[SequenceChunk]) -> int:
    return len(chunks[0].token_ids) if chunks else 1
