"""LLMEngine: the loop's body. `add_request` queues, `step` runs one iteration (schedule,
execute, update from the output) and returns what changed, `abort` withdraws a request."""

from __future__ import annotations

import itertools
import logging
import time

import torch

from argosy.server.engine.input_processor import InputProcessor
from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.engine.parallel_sampling import ParallelSampling
from argosy.server.engine.scheduler import Scheduler, SchedulerOutput
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.engine.startup_report import PhaseClock, StartupReport, tensor_bytes
from argosy.server.engine_config import EngineConfig, resolve_limits
from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig
from argosy.server.outputs import EngineStats, RequestOutput
from argosy.server.sampling_params import SamplingParams
from argosy.server.text.tokenizer import Tokenizer
from argosy.server.worker.device import resolve_device, resolve_dtype
from argosy.server.worker.memory_budget import kv_bytes_per_block, kv_cache_budget, num_kv_blocks
from argosy.server.worker.model_runner import ModelRunner
from argosy.server.worker.sampler import Sampler, SamplerOutput

log = logging.getLogger("argosy.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        path = resolve_model_path(config.model)
        self.model_config = ModelConfig.from_folder(path)
        self.limits = resolve_limits(config, self.model_config)
        self.tokenizer = Tokenizer(path)
        self.inputs = InputProcessor(
            self.tokenizer, self.model_config.vocab_size, self.limits.max_model_len, config.max_num_seqs
        )
        device = resolve_device(config)
        self.dtype = resolve_dtype(config, self.model_config, device)
        torch.manual_seed(config.seed)
        clock = PhaseClock()
        self.runner = ModelRunner(self.model_config, config, self.dtype, device, self.limits.max_model_len)
        clock.lap("load")
        largest_step = min(self.limits.max_num_batched_tokens, self.limits.max_model_len)
        budget = kv_cache_budget(
            config, device, lambda: self.runner.profile_peak_bytes(largest_step, config.max_num_seqs)
        )
        clock.lap("profile")
        block_bytes = kv_bytes_per_block(self.model_config, config.block_size, self.dtype)
        reserved = self.runner.reserved_blocks
        num_blocks = num_kv_blocks(budget, block_bytes, self.limits.max_model_len, config.block_size, reserved)
        self.runner.allocate_kv_cache(num_blocks)
        clock.lap("kv_cache")
        graph_sizes = self.runner.capture_graphs()
        clock.lap("graphs")
        self.startup = StartupReport(
            str(device),
            self.runner.backend.name,
            config.quantization,
            graph_sizes,
            num_blocks,
            tensor_bytes(self.runner.model),
            (num_blocks + reserved) * block_bytes,
            clock.seconds,
        )
        log.info(self.startup.line())
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.kv, config.max_num_seqs, self.limits.max_num_batched_tokens, config.enable_chunked_prefill
        )
        eos = self.model_config.eos_token_ids or tuple(t for t in (self.tokenizer.eos_token_id,) if t is not None)
        self.sampler = Sampler(eos)
        self.outputs = OutputProcessor(self.tokenizer, eos, self.limits.max_model_len)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.parallel_sampling = ParallelSampling(self.scheduler, self.outputs, self._seq_ids)

    def add_request(
        self, request_id: str, prompt: str | list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None:
        """Queues a prompt (text, or token ids). Raises InvalidRequestError, with nothing
        allocated, when the request cannot be served."""
        self.enqueue(self.inputs.make_request(request_id, prompt, params, arrival_time))

    def enqueue(self, request: Request) -> None:
        """Queues a request the InputProcessor made."""
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use", param="request_id")
        seq = Sequence(next(self._seq_ids), request, 0, request.prompt_token_ids)
        request.seqs.append(seq)
        self.requests[request.request_id] = request
        self.outputs.start(seq)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Withdraws a request; its blocks are free when this returns. False if it was not in
        flight (unknown, or finished already)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return False
        for seq in request.seqs:
            if not seq.is_finished:
                self.outputs.abort(seq)
                self.scheduler.finish(seq)
        self.outputs.release(request)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def request_ids(self) -> list[str]:
        return list(self.requests)

    def num_requests(self) -> tuple[int, int]:
        """(waiting, running) in requests, not sequences: a request with a sequence waiting
        (a new one, or preempted) counts as waiting."""
        waiting = {seq.request.request_id for seq in self.scheduler.waiting}
        running = {seq.request.request_id for seq in self.scheduler.running} - waiting
        return len(waiting), len(running)

    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if not scheduled.scheduled:
            if self.scheduler.has_work():
                raise RuntimeError("the scheduler could not schedule any waiting sequence")
            return []
        now = time.monotonic()
        for item in scheduled.scheduled:
            item.seq.request.first_scheduled_time = item.seq.request.first_scheduled_time or now
        logits = self.runner.execute(scheduled)
        return self._update_from_output(scheduled, logits)

    def _update_from_output(self, scheduled: SchedulerOutput, logits: torch.Tensor) -> list[RequestOutput]:
        """Records the step's tokens as computed, samples the sequences whose tokens are all in
        the cache, appends what they drew and returns the outputs of the requests that moved."""
        completing = [item.seq for item in scheduled.scheduled if item.completes]
        self.scheduler.advance(scheduled)
        targets, rows = self.parallel_sampling.expand(completing)
        if not targets:  # only partial prefill chunks ran
            return []
        return self._append(targets, self.sampler(logits if rows is None else logits[rows], targets))

    def _append(self, seqs: list[Sequence], sampled: SamplerOutput) -> list[RequestOutput]:
        moved: dict[str, Request] = {}
        now = time.monotonic()
        for seq, token_id, logprobs in zip(seqs, sampled.token_ids, sampled.logprobs):
            request = seq.request
            request.first_token_time = request.first_token_time or now
            if self.outputs.append(seq, token_id, logprobs):
                self.scheduler.finish(seq)
            moved[request.request_id] = request
        results = [self.outputs.request_output(r) for r in moved.values()]
        for result in results:
            if result.finished:
                del self.requests[result.request_id]
        return results

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            kv_blocks_total=self.kv.num_blocks,
            kv_blocks_used=self.kv.num_used_blocks,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )
