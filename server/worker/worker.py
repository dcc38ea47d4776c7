"""Worker: one rank's device side. It holds its share of the model, its KV cache (and host KV
tier), its adapters in host memory (by content digest) and, on the rank that samples, the
sequences' grammars (by constraint) and the draft model. An executor owns the workers and sends
them the same messages (executor/): `start` loads the model, profiles the largest step, sizes
and allocates the KV cache, warms every kernel variant and captures the CUDA graphs; `execute`
takes a step plan's changes into the sequences' states, runs the forward pass and, on rank 0,
samples the rows the plan names and keeps what it sampled. A Triton kernel that compiles after
start-up (a variant the warm-up missed) is logged as the stall it is."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from argosy.kernels import cpu_kernels
from argosy.server.engine_config import EngineConfig, EngineLimits, tokenizer_path
from argosy.server.executor.plan import PLACEHOLDER, DeviceReady, StepPlan, StepResult
from argosy.server.kv_connector.base import ConnectorWorker
from argosy.server.kv_connector.factory import connector_class
from argosy.server.lora.adapter_folder import AdapterError
from argosy.server.lora.peft_adapter import LoRAAdapter, read_adapter
from argosy.server.lora.request import AdapterRef
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import ReadStats
from argosy.server.parallel.group import SINGLE, TensorParallel
from argosy.server.parallel.pipeline import PipelineParallel
from argosy.server.parallel.stages import PipelineStage, split_layers
from argosy.server.spec_decode.draft_model import DraftModel
from argosy.server.structured.grammar_store import GrammarStore
from argosy.server.worker.device import resolve_device, resolve_dtype
from argosy.server.worker.memory_budget import kv_bytes_per_block, kv_cache_budget, num_kv_blocks
from argosy.server.worker.model_runner import ModelRunner
from argosy.server.worker.sequence_states import SequenceStates
from argosy.server.worker.startup_report import PhaseClock, StartupReport, tensor_bytes
from argosy.server.worker.step_inputs import SequenceChunk
from argosy.server.worker.step_sampler import StepSampler

if TYPE_CHECKING:
    from argosy.kernels.triton_variants import CompiledVariants

log = logging.getLogger("argosy.engine")
IDLE_STEP_WAIT_SECONDS = 0.01  # how long a step with nothing to compute waits for a grammar's compile or a KV pull


class Worker:
    def __init__(
        self,
        config: EngineConfig,
        model: ModelConfig,
        limits: EngineLimits,
        eos_token_ids: tuple[int, ...],
        shards: TensorParallel = SINGLE,
        pipeline: PipelineParallel | None = None,
    ):
        """`shards`: this rank's place in its tensor-parallel group, `pipeline` in the pipeline's
        stages (both joined already)."""
        self.config, self.model_config, self.limits = config, model, limits
        self.eos_token_ids, self.shards, self.pipeline = eos_token_ids, shards, pipeline
        # The driver samples, and holds what sampling needs: the first rank of the last stage.
        self.driver = shards.layout.rank == 0 and (pipeline is None or pipeline.stage.last)
        self.device = rank_device(config, shards.layout.rank if pipeline is None else pipeline.rank)
        self.grammars = None
        if self.driver:
            tokenizer = tokenizer_path(config, Path(model.path))
            self.grammars = GrammarStore(
                tokenizer, model.vocab_size, list(eos_token_ids), config.structured_outputs_max_whitespace
            )
        max_blocks = -(-limits.max_model_len // config.block_size)
        self.states = SequenceStates(max_blocks, self.device, model.vocab_size, eos_token_ids, self.grammars)
        self.sample = StepSampler(eos_token_ids)
        self.dtype = resolve_dtype(config, model, self.device)
        self.runner: ModelRunner | None = None  # once started
        self.variants: CompiledVariants | None = None  # of the Triton kernels, when they run
        self.adapters: dict[str, LoRAAdapter] = {}  # in host memory, by digest, as the engine keeps them
        self.draft: DraftModel | None = None  # with draft-model speculation, on rank 0, once started
        self.report: StartupReport | None = None  # what start settled, once started
        self.kv_connector: ConnectorWorker | None = None  # its worker half, with a KV connector, once started

    def start(self) -> DeviceReady:
        config, limits, device, shards = self.config, self.limits, self.device, self.shards
        dtype = self.dtype
        torch.manual_seed(config.seed)
        clock = PhaseClock()
        runner = self.runner = ModelRunner(
            self.model_config, config, dtype, device, limits.max_model_len, shards, self.pipeline
        )
        spec = config.speculative
        if spec is not None and spec.method == "draft_model" and self.driver:
            self.draft = DraftModel(spec.model, self.model_config, config, dtype, device, limits.max_model_len)
        runners = [runner] if self.draft is None else [runner, self.draft.runner]
        clock.lap("load")
        largest_step = min(limits.max_num_batched_tokens, limits.max_model_len)
        budget = kv_cache_budget(config, device, lambda: runner.profile_peak_bytes(largest_step, config.max_num_seqs))
        clock.lap("profile")
        block_bytes = kv_bytes_per_block(runner.kv_config, config.block_size, dtype)
        if self.draft is not None:  # its cache mirrors the target's, block for block
            block_bytes += self.draft.block_bytes()
        reserved = runner.reserved_blocks
        num_blocks = num_kv_blocks(budget, block_bytes, limits.max_model_len, config.block_size, reserved)
        num_blocks = shards.min_over_ranks(num_blocks)  # the same block ids on every rank
        if self.pipeline is not None:  # every stage's
            num_blocks = self.pipeline.min_over_ranks(num_blocks)
        for each in runners:
            each.allocate_kv_cache(num_blocks)
        connector_blocks = 0
        if (transfer := config.kv_transfer) is not None:
            made = connector_class(transfer).worker(transfer, block_bytes, runner.block_shape, dtype, device)
            self.kv_connector, connector_blocks = made
            log.info("KV connector %s: %d blocks", transfer.kv_connector, connector_blocks)
        clock.lap("kv_cache")
        for each in runners:
            each.warm_up()
        clock.lap("warmup")
        graph_sizes = runner.capture_graphs()  # the draft's are the same sizes
        if self.draft is not None:
            self.draft.runner.capture_graphs()
        clock.lap("graphs")
        self.variants = runner.compiled_variants()
        report = self.report = StartupReport(
            str(device),
            runner.backend.name,
            config.quantization,
            graph_sizes,
            num_blocks,
            sum(tensor_bytes(each.model) for each in runners),
            (num_blocks + reserved) * block_bytes,
            clock.seconds,
            None if self.variants is None else self.variants.count(),
            sum((each.model.checkpoint_read for each in runners), ReadStats()),
            [] if self.pipeline is None else [s.describe() for s in self._stages()],
            str(dtype).removeprefix("torch."),
            cpu_kernels.level_in_use() if device.type == "cpu" else None,
        )
        # Where other replicas pull this one's blocks from: only a P/D connector has one (a plug-in need not say).
        address = getattr(self.kv_connector, "address", None)
        return DeviceReady(num_blocks, report.line(), connector_blocks, report.weight_bytes, block_bytes, address)

    def _stages(self) -> list[PipelineStage]:
        return split_layers(self.model_config.num_layers, self.pipeline.stage.size)

    def execute(self, plan: StepPlan) -> StepResult | None:
        """The step's result on rank 0; None on the others (they only compute)."""
        if self.grammars is not None:
            for params in plan.grammars:
                self.grammars.prepare(params)
        ran = self._forward(plan)
        if not self.driver:
            return None
        result = StepResult([], [], [])
        if ran is not None and plan.samples:
            chunks, logits = ran
            result = self.sample(plan, chunks, logits, self.states, self.draft)
        wait = IDLE_STEP_WAIT_SECONDS if not plan.chunks and not plan.new_sequences else 0.0
        result.grammars_ready, result.grammar_errors = self.grammars.finished(wait)
        if self.kv_connector is not None:
            result.kv_connector = self.kv_connector.finished(wait)
        return result

    def _forward(self, plan: StepPlan) -> tuple[list[SequenceChunk], torch.Tensor] | None:
        """The plan's changes taken, its copies made and its forward pass run: the chunks and
        their logits; None when the step only loaded blocks."""
        states = self.states
        states.apply(plan)
        for slot, digest in plan.lora_loads:
            self.runner.lora.load(slot, self.adapters[digest])
        if self.kv_connector is not None:
            with torch.inference_mode():
                self.kv_connector.start(self.runner.kv_cache, plan.kv_connector)
        if not plan.chunks:  # the step only loaded blocks for sequences that compute from the next
            return None
        chunks = []
        for c in plan.chunks:
            state = states[c.seq_id]
            tokens = c.token_ids
            if tokens[-1] == PLACEHOLDER:  # planned before the step that sampled it had run: it has now
                tokens = [*tokens[:-1], state.output_token_ids[-1]]
            chunks.append(
                SequenceChunk(
                    tokens, c.start, state.block_table, c.sample, state.table_row, state.lora_slot, c.num_draft
                )
            )
        logits = self.runner.execute(chunks, plan.block_copies, states.tables)
        if self.draft is not None:
            self.draft.mirror(chunks, plan.block_copies, states.tables)
        if self.variants is not None and (compiled := self.variants.new()):
            log.warning(
                "a Triton kernel compiled a variant the start-up warm-up had not, and every request waited for it "
                "(variants now: %s); please report this with the engine's settings",
                compiled,
            )
        return chunks, logits

    def check_device(self) -> None:
        self.runner.check_device()

    def add_adapter(self, ref: AdapterRef) -> None:
        """The adapter read into host memory (unless here); raises AdapterError when its files no
        longer hold the weights it was registered with: a request never runs on weights other than
        those its name stood for."""
        if ref.digest in self.adapters:
            return
        config = self.config
        adapter = read_adapter(ref.name, ref.path, self.model_config, config.max_lora_rank, self.dtype)
        if adapter.digest != ref.digest:
            raise AdapterError(
                ref.path, f"the weights changed since adapter {ref.name!r} was loaded; load it again to serve them"
            )
        self.adapters[ref.digest] = adapter

    def remove_adapter(self, digest: str) -> None:
        self.adapters.pop(digest, None)

    def update_weights(self, path: str) -> None:
        self.runner.update_weights(path)
        if self.driver:
            log.info("weights updated from %s", path)

    def sleep(self, level: int) -> int:
        freed = self.runner.sleep(level) + (0 if self.draft is None else self.draft.runner.sleep(level))
        if self.driver:
            log.info("asleep at level %s: %.1f MiB freed", level, freed / (1 << 20))
        return freed

    def wake_up(self) -> None:
        self.runner.wake_up()
        if self.draft is not None:
            self.draft.runner.wake_up()
        if self.driver:
            log.info("awake")


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of a rank (numbered across the stages and nodes): its own GPU of its node's, or
    the host's CPU."""
    device = resolve_device(config)
    return torch.device("cuda", rank % config.ranks_per_node) if device.type == "cuda" else device
