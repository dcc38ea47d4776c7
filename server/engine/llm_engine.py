"""LLMEngine: the loop's body. `add_request` queues, `step` runs one iteration (schedule,
forward, sample, append, finish) and returns what changed, `abort` withdraws a request."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch

from argosy.server.engine_config import EngineConfig, resolve_limits
from argosy.server.models.default_model import resolve_model_path
from argosy.server.exceptions import InvalidRequestError
from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.models.model_config import ModelConfig
from argosy.server.worker.device import resolve_device, resolve_dtype
from argosy.server.worker.memory_budget import kv_bytes_per_block, kv_cache_budget
from argosy.server.worker.model_runner import ModelRunner
from argosy.server.engine.output_processor import OutputProcessor
from argosy.server.outputs import RequestOutput
from argosy.server.worker.sampler import Sampler
from argosy.server.sampling_params import SamplingParams
from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class EngineStats:
    num_waiting: int
    num_running: int
    kv_blocks_total: int
    kv_blocks_used: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    num_preemptions: int

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        path = resolve_model_path(config.model)
        self.model_config = ModelConfig.from_folder(path)
        self.limits = resolve_limits(config, self.model_config)
        self.tokenizer = Tokenizer(path)
        device = resolve_device(config)
        self.dtype = resolve_dtype(config, self.model_config, device)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(self.model_config, self.dtype, device, self.limits.max_model_len,
                                  config.block_size)
        largest_step = min(self.limits.max_num_batched_tokens, self.limits.max_model_len)
        budget = kv_cache_budget(config, device,
                                 lambda: self.runner.profile_peak_bytes(largest_step, config.max_num_seqs))
        num_blocks = self._num_blocks(budget, kv_bytes_per_block(self.model_config, config.block_size, self.dtype))
        self.runner.allocate_kv_cache(num_blocks)
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.kv, config.max_num_seqs, self.limits.max_num_batched_tokens,
                                   config.enable_chunked_prefill)
        eos = self.model_config.eos_token_ids or tuple(
            t for t in (self.tokenizer.eos_token_id,) if t is not None)
        self.sampler = Sampler(eos)
        self.outputs = OutputProcessor(self.tokenizer, eos, self.limits.max_model_len)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()

    def _num_blocks(self, budget: int, block_bytes: int) -> int:
        num_blocks = budget // block_bytes
        needed = -(-self.limits.max_model_len // self.config.block_size)
        if num_blocks < needed:
            raise InvalidRequestError(
                f"kv_cache_memory of {budget} bytes holds {num_blocks} blocks of {self.config.block_size} tokens, "
                f"fewer than one sequence of max_model_len {self.limits.max_model_len} needs ({needed}); "
                "raise kv_cache_memory or lower max_model_len", param="kv_cache_memory")
        return num_blocks

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> None:
        """Queues a prompt (text, or token ids). Raises InvalidRequestError, with nothing
        allocated, when the request cannot be served."""
        self.enqueue(self.make_request(request_id, prompt, params, arrival_time))

    def make_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                     arrival_time: float | None = None) -> Request:
        """Tokenizes and validates a request without touching the engine's queues, so that
        another thread may do it while the engine steps."""
        params.validate()
        text = prompt if isinstance(prompt, str) else None
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_prompt(token_ids, params)
        return Request(request_id, text, token_ids, params, arrival_time or time.monotonic())

    def enqueue(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in use", param="request_id")
        seq = Sequence(next(self._seq_ids), request, 0, request.prompt_token_ids)
        request.seqs.append(seq)
        self.requests[request.request_id] = request
        self.outputs.start(seq)
        self.scheduler.add(seq)

    def _check_prompt(self, token_ids: list[int], params: SamplingParams) -> None:
        max_len = self.limits.max_model_len
        if not token_ids:
            raise InvalidRequestError("the prompt is empty", param="prompt")
        vocab = self.model_config.vocab_size
        bad = next((t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"prompt token id {bad!r} is outside the vocabulary [0, {vocab})",
                                      param="prompt")
        if len(token_ids) >= max_len:
            raise InvalidRequestError(f"the prompt has {len(token_ids)} tokens; max_model_len is {max_len}, "
                                      "which leaves no room for output", param="prompt")
        if params.max_tokens is not None and len(token_ids) + params.max_tokens > max_len:
            raise InvalidRequestError(
                f"max_tokens ({params.max_tokens}) plus the prompt's {len(token_ids)} tokens exceeds max_model_len "
                f"({max_len})", param="max_tokens")
        bad = next((t for t in params.stop_token_ids if t >= vocab), None)
        if bad is not None:
            raise InvalidRequestError(f"stop token id {bad} is outside the vocabulary [0, {vocab})",
                                      param="stop_token_ids")
        if params.n > self.config.max_num_seqs:
            raise InvalidRequestError(f"n ({params.n}) exceeds max_num_seqs ({self.config.max_num_seqs})",
                                      param="n")

    def abort(self, request_id: str) -> None:
        """Withdraws a request; its blocks are free when this returns."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return
        for seq in request.seqs:
            if not seq.is_finished:
                self.outputs.abort(seq)
                self.scheduler.finish(seq)
        self.outputs.release(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            if self.scheduler.has_work():
                raise RuntimeError("the scheduler could not schedule any waiting sequence")
            return []
        now = time.monotonic()
        for item in sched.scheduled:
            item.seq.request.first_scheduled_time = item.seq.request.first_scheduled_time or now
        logits = self.runner.execute(sched)
        completing = [item.seq for item in sched.scheduled if item.completes]
        self.scheduler.advance(sched)
        targets, rows = self._fork_pending(completing)
        if not targets:  # only partial prefill chunks ran
            return []
        sampled = self.sampler(logits if rows is None else logits[rows], targets)
        touched: dict[str, Request] = {}
        now = time.monotonic()
        for seq, token_id, logprobs in zip(targets, sampled.token_ids, sampled.logprobs):
            request = seq.request
            request.first_token_time = request.first_token_time or now
            if self.outputs.append(seq, token_id, logprobs):
                self.scheduler.finish(seq)
            touched[request.request_id] = request
        results = [self.outputs.request_output(r) for r in touched.values()]
        for result in results:
            if result.finished:
                del self.requests[result.request_id]
        return results

    def _fork_pending(self, completing: list[Sequence]) -> tuple[list[Sequence], torch.Tensor | None]:
        """The sequences to sample this step, and each one's logits row (None: one row each,
        in order). A request with n > 1 computes its prompt once; when the prompt is done its
        n sequences fork from one row."""
        targets, rows = [], []
        for row, seq in enumerate(completing):
            targets.append(seq)
            rows.append(row)
            request = seq.request
            if seq.num_output_tokens == 0 and len(request.seqs) < request.params.n:
                for index in range(len(request.seqs), request.params.n):
                    child = seq.fork(next(self._seq_ids), index)
                    request.seqs.append(child)
                    self.scheduler.fork(seq, child)
                    self.outputs.fork(seq, child)
                    targets.append(child)
                    rows.append(row)
        if len(targets) == len(completing):
            return targets, None
        return targets, torch.tensor(rows, dtype=torch.long, device=self.runner.device)

    def stats(self) -> EngineStats:
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            kv_blocks_total=self.kv.pool.num_blocks,
            kv_blocks_used=self.kv.num_used_blocks,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
        )
