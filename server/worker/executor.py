"""InProcessExecutor: the device side in the engine core's own process. At start it loads the
model, profiles the largest step, sizes and allocates the KV cache, warms every kernel variant
and captures the CUDA graphs; each step it takes the plan's changes into the sequences' states,
runs the forward pass, samples the rows the plan names and keeps what it sampled. A Triton
kernel that compiles after start-up (a variant the warm-up missed) is logged as the stall it is.
With a draft model, it runs every step too, and proposes after the sampling (DraftModel)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from argosy.server.engine_config import EngineConfig, EngineLimits
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.executor import Grammars
from argosy.server.executor.plan import DeviceReady, StepPlan, StepResult
from argosy.server.lora.host_cache import AdapterHostCache
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import ReadStats
from argosy.server.parallel.group import SINGLE, TensorParallel, check_collectives, check_visible_gpus, join_group
from argosy.server.parallel.layout import check_tensor_parallel
from argosy.server.parallel.plan_channel import receive_plan, send_plan
from argosy.server.parallel.rank_processes import RankProcesses, share_cpu_threads
from argosy.server.spec_decode.config import SpeculativeConfig
from argosy.server.spec_decode.draft_model import DraftModel, ProposalStart
from argosy.server.spec_decode.verifier import DraftVerifier
from argosy.server.worker.device import resolve_device, resolve_dtype
from argosy.server.worker.memory_budget import kv_bytes_per_block, kv_cache_budget, num_kv_blocks
from argosy.server.worker.model_runner import ModelRunner
from argosy.server.worker.sampler import Sampler
from argosy.server.worker.sequence_states import SequenceState, SequenceStates
from argosy.server.worker.startup_report import PhaseClock, StartupReport, tensor_bytes
from argosy.server.worker.step_inputs import SequenceChunk

if TYPE_CHECKING:
    from argosy.kernels.triton_variants import CompiledVariants

log = logging.getLogger("argosy.engine")


class InProcessExecutor:
    def __init__(
        self,
        config: EngineConfig,
        model: ModelConfig,
        limits: EngineLimits,
        eos_token_ids: tuple[int, ...],
        shards: TensorParallel | None = None,
    ):
        """`shards`: this executor's place in a tensor-parallel group, for ranks 1..N-1; rank 0
        (None) starts them and joins them when tensor_parallel_size > 1."""
        self.config, self.model_config, self.limits = config, model, limits
        self.eos_token_ids = eos_token_ids
        self.shards = shards
        self.ranks: RankProcesses | None = None  # rank 0's view of the other ranks
        self.sampler = Sampler(eos_token_ids)
        self.verifier = DraftVerifier(self.sampler)
        max_blocks = -(-limits.max_model_len // config.block_size)
        self.device = rank_device(config, 0 if shards is None else shards.layout.rank)
        self.states = SequenceStates(max_blocks, self.device, model.vocab_size, eos_token_ids)
        self.runner: ModelRunner | None = None  # once started
        self.report: StartupReport | None = None  # what start settled, once started
        self.variants: CompiledVariants | None = None  # of the Triton kernels, when they run
        self.adapters: AdapterHostCache | None = None  # with LoRA on, once started
        self.draft: DraftModel | None = None  # with draft-model speculation, once started

    def start(self) -> DeviceReady:
        config, limits, device = self.config, self.limits, self.device
        dtype = resolve_dtype(config, self.model_config, device)
        torch.manual_seed(config.seed)
        clock = PhaseClock()
        shards = self.shards = self.shards or self._start_ranks(device)
        runner = self.runner = ModelRunner(self.model_config, config, dtype, device, limits.max_model_len, shards)
        spec = SpeculativeConfig.parse(config.speculative_config)
        if spec is not None and spec.method == "draft_model":
            self.draft = DraftModel(spec.model, self.model_config, config, dtype, device, limits.max_model_len)
        runners = [runner] if self.draft is None else [runner, self.draft.runner]
        if config.enable_lora:
            cpu_loras = config.max_cpu_loras or config.max_loras
            self.adapters = AdapterHostCache(self.model_config, config.max_lora_rank, dtype, cpu_loras)
        clock.lap("load")
        largest_step = min(limits.max_num_batched_tokens, limits.max_model_len)
        budget = kv_cache_budget(config, device, lambda: runner.profile_peak_bytes(largest_step, config.max_num_seqs))
        clock.lap("profile")
        block_bytes = kv_bytes_per_block(shards.layout.local_config(self.model_config), config.block_size, dtype)
        if self.draft is not None:  # its cache mirrors the target's, block for block
            block_bytes += self.draft.block_bytes()
        reserved = runner.reserved_blocks
        num_blocks = num_kv_blocks(budget, block_bytes, limits.max_model_len, config.block_size, reserved)
        num_blocks = shards.min_over_ranks(num_blocks)  # the same block ids on every rank
        for each in runners:
            each.allocate_kv_cache(num_blocks)
        num_host_blocks = int(config.swap_space * (1 << 30)) // block_bytes
        if num_host_blocks:
            runner.allocate_host_cache(num_host_blocks)
            log.info("host KV tier: %d blocks, %.2f GiB", num_host_blocks, runner.host_cache.nbytes / (1 << 30))
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
        )
        log.info(report.line())
        return DeviceReady(num_blocks, report.line(), num_host_blocks)

    def _start_ranks(self, device: torch.device) -> TensorParallel:
        """Rank 0's group: the other ranks started, and joined (nothing to do for one rank)."""
        size = self.config.tensor_parallel_size
        if size == 1:
            return SINGLE
        check_tensor_parallel(self.model_config, size)
        check_collectives(device)
        if device.type == "cuda":
            check_visible_gpus(size, torch.cuda.device_count())
        if device.type == "cpu":
            share_cpu_threads(size)
        self.ranks = RankProcesses(self.config, self.model_config, self.limits, self.eos_token_ids)
        return join_group(0, size, self.ranks.address, device)

    def execute(self, plan: StepPlan) -> StepResult:
        if self.ranks is not None:
            self.ranks.check_alive()
            send_plan(plan, self.shards)
        ran = self._forward(plan)
        if ran is None or not plan.samples:  # only loads, or only partial prefill chunks, ran
            return StepResult([], [], [])
        chunks, logits = ran
        states = self.states
        seqs = [states[s.seq_id] for s in plan.samples]
        drafts = [s.draft for s in plan.samples]
        num_drafted = sum(map(len, drafts))
        if len(plan.samples) + num_drafted > len(logits):  # parallel samples share their parent's row
            rows = [s.logits_row + j for s in plan.samples for j in range(1 + len(s.draft))]
            logits = logits[torch.tensor(rows, device=logits.device)]
        if num_drafted:
            out = self.verifier(logits, seqs, drafts)
            token_ids, logprobs, errors = out.token_ids, out.logprobs, out.errors
        else:
            sampled = self.sampler(logits, seqs)
            token_ids, errors = [[token_id] for token_id in sampled.token_ids], sampled.errors
            logprobs = [None if lp is None else [lp] for lp in sampled.logprobs]
        complete = []
        for row, (seq, tokens, error) in enumerate(zip(seqs, token_ids, errors)):
            if error is None:
                errors[row], ends = _keep(seq, tokens)
                if ends:
                    complete.append(row)
                    del tokens[ends:]
                    if logprobs[row] is not None:
                        del logprobs[row][ends:]
        drafts = self._propose(plan, chunks, token_ids, errors, complete) if self.draft is not None else []
        return StepResult(token_ids, logprobs, errors, complete, drafts)

    def _forward(self, plan: StepPlan) -> tuple[list[SequenceChunk], torch.Tensor] | None:
        """The plan's changes taken, its copies made and its forward pass run: the chunks and
        their logits; None when the step only loaded blocks."""
        states = self.states
        states.apply(plan)
        for slot, digest in plan.lora_loads:
            self.runner.lora.load(slot, self.adapters[digest])
        self.runner.copy_host_blocks(plan.host_stores, plan.host_loads)
        if not plan.chunks:  # the step only loaded blocks for sequences that compute from the next
            return None
        chunks = []
        for c in plan.chunks:
            state = states[c.seq_id]
            chunks.append(
                SequenceChunk(
                    c.token_ids, c.start, state.block_table, c.sample, state.table_row, state.lora_slot, c.num_draft
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

    def follow(self) -> None:
        """Ranks 1..N-1: runs each plan rank 0 sends (its forward pass: the sampling is rank 0's)
        until rank 0 says stop."""
        while (plan := receive_plan(self.shards)) is not None:
            self._forward(plan)

    def _propose(
        self,
        plan: StepPlan,
        chunks: list[SequenceChunk],
        token_ids: list[list[int]],
        errors: list[str | None],
        complete: list[int],
    ) -> list[list[int]]:
        """The draft model's proposals for the rows that asked, from each one's last kept token."""
        chunk_of = {c.seq_id: chunk for c, chunk in zip(plan.chunks, chunks)}
        rows, starts = [], []
        for row, sample in enumerate(plan.samples):
            tokens = token_ids[row]
            if not sample.propose or errors[row] is not None or row in complete or not tokens:
                continue
            chunk = chunk_of[sample.seq_id]
            # The kept tokens follow the chunk's own; the last of them is the next one to compute.
            position = chunk.start + len(chunk.token_ids) - chunk.num_draft + len(tokens) - 1
            rows.append(row)
            starts.append(ProposalStart(tokens[-1], position, chunk.block_table, chunk.table_row, sample.propose))
        if not starts:
            return []
        drafts: list[list[int]] = [[] for _ in plan.samples]
        for row, draft in zip(rows, self.draft.propose(starts, self.states.tables)):
            drafts[row] = draft
        return drafts

    def check_device(self) -> None:
        if self.ranks is not None:  # a scratch step needs every rank: a dead one is a broken device
            self.ranks.check_alive()
        self.runner.check_device()

    def use_grammars(self, grammars: Grammars) -> None:
        self.states.grammars = grammars

    def update_weights(self, path: str) -> None:
        self._single_rank("update the weights")
        self.runner.update_weights(path)
        log.info("weights updated from %s", path)

    def sleep(self, level: int) -> int:
        self._single_rank("sleep")
        freed = self.runner.sleep(level) + (0 if self.draft is None else self.draft.runner.sleep(level))
        log.info("asleep at level %s: %.1f MiB freed", level, freed / (1 << 20))
        return freed

    def _single_rank(self, what: str) -> None:
        if self.ranks is not None:
            raise InvalidRequestError(f"cannot {what} with tensor_parallel_size above 1 yet")

    def wake_up(self) -> None:
        self.runner.wake_up()
        if self.draft is not None:
            self.draft.runner.wake_up()
        log.info("awake")


def rank_device(config: EngineConfig, rank: int) -> torch.device:
    """The device of a tensor-parallel rank: its own GPU, or the host's CPU."""
    device = resolve_device(config)
    return torch.device("cuda", rank) if device.type == "cuda" else device


def _keep(seq: SequenceState, token_ids: list[int]) -> tuple[str | None, int]:
    """Appends a step's tokens to the sequence (its grammar following them): why they cannot
    be kept, and, where its grammar completes, how many tokens end it (0: it goes on)."""
    for kept, token_id in enumerate(token_ids, start=1):
        seq.output_token_ids.append(token_id)
        if seq.grammar is not None:
            if not seq.grammar.accept(token_id):
                return f"the sampled token {token_id} breaks the request's grammar", 0
            if seq.grammar.complete:
                return None, kept
    return None, 0
