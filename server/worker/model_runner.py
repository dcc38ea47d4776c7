"""ModelRunner: owns the model and the KV cache on the device. A step is two parts: its inputs
are prepared (step_inputs.py), then one forward pass returns the logits of the sequences to
sample; decode steps go through CUDA graphs (cuda_graphs.py) when they are on, and on CPU every
step's decoder layers run in one C++ call (one_call_layers.py) where the kernels cover them. The
memory-profiling pass goes through the same parts.

Between steps the weights may change: swapped in place for a new checkpoint's (the graphs keep
their addresses), or, asleep, the KV cache freed (level 1) and the weights too (level 2), until
wake-up allocates them again and captures the graphs anew."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from argosy.kernels.attention_backend import select_backend
from argosy.server.engine_config import EngineConfig
from argosy.server.lora.device_weights import LoRAContext, LoRAWeights
from argosy.server.models.linear_factory import LinearFactory
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.one_call_layers import one_call_layers
from argosy.server.models.weight_swap import check_same_tensors, copy_weights, stage_checkpoint
from argosy.server.parallel.group import SINGLE, TensorParallel
from argosy.server.parallel.pipeline import PipelineParallel
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.cuda_graphs import DecodeGraphs, capture_shapes, capture_sizes, graphs_enabled
from argosy.server.worker.startup_report import tensor_bytes
from argosy.server.worker.step_inputs import ModelInputs, SequenceChunk, prepare_inputs

if TYPE_CHECKING:
    from argosy.kernels.triton_variants import CompiledVariants


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        engine_config: EngineConfig,
        dtype: torch.dtype,
        device: torch.device,
        max_model_len: int,
        shards: TensorParallel = SINGLE,
        pipeline: PipelineParallel | None = None,
    ):
        """`shards`: with tensor parallelism, this rank's share of the model (its KV cache holds
        its KV heads only); `pipeline`: with pipeline parallelism, its stage (its KV cache holds
        the stage's layers only)."""
        self.dtype, self.device, self.engine_config = dtype, device, engine_config
        self.block_size, self.max_model_len = engine_config.block_size, max_model_len
        self.shards, self.pipeline = shards, pipeline
        self.stage = None if pipeline is None else pipeline.stage
        self.kv_config = shards.layout.local_config(model_config)  # the KV cache's heads (and layers)
        if self.stage is not None:
            self.kv_config = dataclasses.replace(self.kv_config, num_layers=self.stage.num_layers)
        self.backend = select_backend(engine_config.attention_backend, device, self.kv_config.num_kv_heads)
        self.lora_context = LoRAContext()
        self.lora = None  # the adapters' device slots, with LoRA on
        if engine_config.enable_lora:
            self.lora = LoRAWeights(
                model_config, engine_config.max_loras, engine_config.max_lora_rank, dtype, device, shards.layout
            )
        # A step's graph would span the stages' sends and receives: pipeline stages run eagerly.
        self.graphs_on = graphs_enabled(engine_config, device, self.backend) and pipeline is None
        # The null block: one cache block no sequence owns, which the padding rows of a
        # graph's batch write to and read.
        self.reserved_blocks = 1 if self.graphs_on else 0
        self.num_blocks = 0  # of the sequences, once the KV cache is allocated
        self.asleep = 0  # the sleep level: 0 awake, 1 without KV cache, 2 without weights either
        self._load(model_config)
        self.kv_cache = self._empty_cache(0)

    def _load(self, cfg: ModelConfig) -> None:
        """The model from `cfg`'s checkpoint (cfg.path: where the weights serving come from),
        with the LoRA layers attached, and the graphs over it (captured later)."""
        config, device = self.engine_config, self.device
        linears = LinearFactory.for_device(config.quantization, device, self.dtype)
        model = load_model(cfg, self.dtype, device, self.max_model_len, self.backend, linears, self.shards, self.stage)
        self.cfg, self.model = cfg, model  # only once it loaded: a failed load changes nothing
        if self.lora is not None:
            self.lora.attach(self.model, self.lora_context, self.backend.kernels.lora)
        if not config.enforce_eager:  # once the LoRA layers are on: a layer with additions stays a module
            self.model.one_call = one_call_layers(self.model, self.backend)
        self.graphs = None
        if self.graphs_on:
            self.graphs = DecodeGraphs(
                self.model,
                self.backend,
                capture_shapes(
                    capture_sizes(config.cuda_graph_sizes, config.max_num_seqs),
                    config.speculative,
                ),
                -(-self.max_model_len // self.block_size),
                self.block_size,
                self.max_model_len,
                device,
                self.lora_context if self.lora is not None else None,
            )

    def _empty_cache(self, num_blocks: int) -> torch.Tensor:
        # Zeroed, not empty: masked-out slots are still multiplied by zero probabilities,
        # and uninitialised memory could hold NaN.
        cfg = self.kv_config
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
        """num_blocks for the sequences, then the reserved ones."""
        self.num_blocks = num_blocks
        self.kv_cache = self._empty_cache(num_blocks + self.reserved_blocks)

    @property
    def block_shape(self) -> tuple[int, ...]:
        """One block of every layer's K and V: [layers, 2, block_size, kv_heads, head_dim]."""
        cfg = self.kv_config
        return cfg.num_layers, 2, self.block_size, cfg.num_kv_heads, cfg.head_dim

    def update_weights(self, path: str) -> None:
        """The checkpoint at `path` serves from now on; raises CheckpointError, changing nothing,
        when it does not match the running model. Asleep without weights, they are loaded now
        (the KV cache waits for the wake-up)."""
        if self.asleep == 2:
            check_same_tensors(self.cfg.path, path)
            self._load(dataclasses.replace(self.cfg, path=str(path)))
            self.asleep = 1
            return
        where = self.dtype, self.max_model_len, self.shards, self.stage
        staged = stage_checkpoint(self.cfg, path, *where)  # raises first
        try:
            copy_weights(staged, self.model, self.dtype)
        except Exception:  # a device failure halfway: the serving weights go back whole
            serving = stage_checkpoint(self.cfg, self.cfg.path, *where)
            copy_weights(serving, self.model, self.dtype)
            raise
        self.cfg = dataclasses.replace(self.cfg, path=str(path))

    def sleep(self, level: int) -> int:
        """Frees the KV cache (and with level 2 the weights); returns the bytes freed."""
        before = self._held_bytes()
        self.kv_cache = self._empty_cache(0)
        if self.graphs is not None:
            self.graphs.release()
        if level == 2:
            self.model = self.graphs = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.asleep = max(self.asleep, level)
        return before - self._held_bytes()

    def wake_up(self) -> None:
        """Weights (from the checkpoint serving last) and KV cache back, kernels warmed, graphs captured."""
        if self.asleep == 2:
            self._load(self.cfg)
        self.allocate_kv_cache(self.num_blocks)
        self.warm_up()
        self.capture_graphs()
        self.asleep = 0

    def _held_bytes(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device)
        return self.kv_cache.nbytes + (0 if self.model is None else tensor_bytes(self.model))

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Launches every kernel variant serving can produce, so that none compiles while
        requests wait (a Triton kernel compiles at its first launch of each variant): an eager
        step of a prefill beside a decode of max_model_len keys (split as far as one decode's
        context ever is, so the splits' reduction runs too), a lone decode (one token's views of
        the projections have strides of their own), and a block copy, on the KV cache itself,
        whose blocks are all free now; the two blocks it writes are zeroed after. With LoRA on,
        the steps run with an adapter's slot (still zeros: it adds nothing). Decodes through the
        graphs are warmed by their capture. Nothing to do for a backend whose kernels are built
        before the model loads."""
        if not self.backend.compiles_kernels:
            return
        bs, cache = self.block_size, self.kv_cache
        blocks = [0] * max(2, -(-self.max_model_len // bs))  # one block read over and over: any key will do
        slot = -1 if self.lora is None else 0
        prefill = SequenceChunk([0, 0], 0, blocks, sample=True, lora_slot=slot)
        decode = SequenceChunk([0], self.max_model_len - 1, blocks, sample=True, lora_slot=slot)
        for chunks in ([prefill, decode], [decode]):
            self.forward(prepare_inputs(chunks, bs, self.device, self.backend), cache)
        last = min(1, cache.shape[2] - 1)
        self.backend.copy_blocks(cache, *(torch.tensor([b], device=self.device) for b in (0, last)))
        cache[:, :, : last + 1].zero_()

    def compiled_variants(self) -> CompiledVariants | None:
        """The Triton kernels' variants, where the backend runs them (Triton is imported then only)."""
        if not self.backend.compiles_kernels:
            return None
        from argosy.kernels.triton_variants import CompiledVariants

        return CompiledVariants(self.device)

    def capture_graphs(self) -> list[int]:
        """The batch sizes captured (none with graphs off)."""
        if self.graphs is None:
            return []
        self.graphs.capture(self.kv_cache, null_block=self.kv_cache.shape[2] - 1)  # the reserved block
        return self.graphs.sizes

    @torch.inference_mode()
    def execute(
        self, chunks: list[SequenceChunk], block_copies: list[tuple[int, int]], tables: BlockTables
    ) -> torch.Tensor | None:
        """Makes the block copies, then runs the step (`tables` holds the chunks' block tables);
        returns logits in the model's dtype (the sampler widens only the rows it must), one row
        per chunk with `sample` (1 + num_draft with drafts), in order; None on a pipeline stage
        before the last (it sends its activations on)."""
        if block_copies:
            src, dst = zip(*block_copies)
            self.backend.copy_blocks(
                self.kv_cache, torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
            )
        if self.graphs is not None and self.graphs.fits(chunks):
            return self.model.compute_logits(self.graphs.run(chunks, tables))
        order = _by_adapter(chunks) if self.lora is not None else None
        ordered = chunks if order is None else [chunks[i] for i in order]
        inputs = prepare_inputs(ordered, self.block_size, self.device, self.backend, tables)
        logits = self.forward(inputs, self.kv_cache)
        if order is None or logits is None:
            return logits
        first_row, row = {}, 0
        for i in order:
            first_row[i], row = row, row + chunks[i].num_logits
        rows = [first_row[i] + j for i, c in enumerate(chunks) for j in range(c.num_logits)]
        return logits[torch.tensor(rows, device=self.device)]

    @torch.inference_mode()
    def forward(self, inputs: ModelInputs, kv_cache: torch.Tensor) -> torch.Tensor | None:
        """The logits of the rows to sample; None on a pipeline stage before the last, which sends
        its activations to the next stage (every stage runs every forward pass, in the same order)."""
        stage, carried = self.stage, None
        if stage is not None and not stage.first:
            size = self.model.config.hidden_size
            carried = self.pipeline.receive(inputs.input_ids.shape[0], size, self.dtype, self.device)
        with self.lora_context.serving(inputs.lora):
            hidden = self.model(inputs.input_ids, inputs.positions, kv_cache, inputs.attention, carried)
        if stage is not None and not stage.last:
            self.pipeline.send(hidden)
            return None
        return self.model.compute_logits(hidden[inputs.logits_rows])

    def profile_peak_bytes(self, num_tokens: int, num_logits: int) -> int | None:
        """Runs the largest step the scheduler can produce, a prefill of num_tokens with logits
        for num_logits rows, into a scratch cache, and returns the device's peak memory:
        weights plus activations, plus (graphs on) the activations of the largest graph,
        which the graphs' memory pool keeps. None on CPU, whose KV cache is sized by bytes
        alone; the passes themselves run anyway."""
        num_blocks = -(-num_tokens // self.block_size)
        prefill = SequenceChunk([0] * num_tokens, 0, list(range(num_blocks)), sample=True)
        inputs = prepare_inputs([prefill], self.block_size, self.device, self.backend)
        inputs = dataclasses.replace(inputs, logits_rows=torch.arange(min(num_logits, num_tokens), device=self.device))
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self.forward(inputs, self._empty_cache(num_blocks))
        peak = torch.cuda.max_memory_allocated(self.device) if cuda else 0
        if self.graphs is not None:
            if cuda:
                torch.cuda.reset_peak_memory_stats(self.device)
                before = torch.cuda.memory_allocated(self.device)
            self._scratch_decode(self.graphs.max_tokens)
            if cuda:
                peak += torch.cuda.max_memory_allocated(self.device) - before
        return peak if cuda else None

    def check_device(self) -> None:
        """One decode token into a scratch block, waited for: raises if the device can no
        longer compute (a sticky CUDA error fails every later call)."""
        self._scratch_decode(1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _scratch_decode(self, batch: int) -> None:
        """A decode step of `batch` sequences into a one-block scratch cache."""
        decodes = [SequenceChunk([0], 0, [0], sample=True) for _ in range(batch)]
        self.forward(prepare_inputs(decodes, self.block_size, self.device, self.backend), self._empty_cache(1))


def _by_adapter(chunks: list[SequenceChunk]) -> list[int] | None:
    """The chunks' order with each adapter's sequences side by side (the base model's first), so
    that an eager step runs one pair of LoRA products per adapter; None when they are already."""
    order = sorted(range(len(chunks)), key=lambda i: chunks[i].lora_slot)
    return None if all(i == j for i, j in enumerate(order)) else order
