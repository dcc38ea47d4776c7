"""EngineCore: the scheduler and the KV-cache manager, in tokens only, before an Executor (the
device side). `step` runs one iteration: schedule, plan (StepPlanner), execute and sample on the
device, then record what was kept and check each sequence's stops. The offline engine calls it
in-process; `argosy serve` runs it in a child process (core_process.py). A request with a
constraint waits, unscheduled, while its grammar compiles (GrammarGate).

What fails in a step belongs to one request or to all. Sampling a sequence (its parameters,
its logits, its seeded generator) and checking its stop conditions are the request's: a failure
there ends that request alone (`take_failed`), and the step's other tokens stand. Scheduling,
block copies, the inputs and the forward pass are the step's: a failure there raises."""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import time
from collections import deque

from argosy.server.engine.block_hash import BlockHasher
from argosy.server.engine.core_protocol import EngineCoreOutput, EngineCoreRequest, RequestFailed
from argosy.server.engine.grammar_gate import GrammarGate
from argosy.server.engine.in_flight import InFlightStep
from argosy.server.engine.kv_cache_manager import KVCacheManager
from argosy.server.engine.parallel_sampling import ParallelSampling
from argosy.server.engine.scheduler import Scheduler
from argosy.server.engine.scheduler_output import SchedulerOutput
from argosy.server.engine.sequence import Request, Sequence
from argosy.server.engine.step_planner import StepPlanner
from argosy.server.engine.stop_conditions import finish_reason
from argosy.server.engine_config import EngineConfig, resolve_limits, tokenizer_path
from argosy.server.exceptions import InvalidRequestError
from argosy.server.executor.backends import make_executor
from argosy.server.executor.executor import Done, Executor
from argosy.server.executor.plan import StepPlan, StepResult, TokenLogprobs
from argosy.server.kv_connector.factory import connector_class
from argosy.server.kv_events.publisher import ZmqEventPublisher
from argosy.server.kv_events.recorder import KVEventRecorder
from argosy.server.kv_events.wire import AllBlocksCleared, EventBatch
from argosy.server.kv_tier.tier_scheduler import HostTierScheduler
from argosy.server.kv_transfer.transfer_scheduler import TransferScheduler
from argosy.server.lora.host_cache import AdapterHostCache
from argosy.server.lora.manager import LoRAManager
from argosy.server.lora.request import AdapterRef
from argosy.server.lora.slots import LoRASlots
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig
from argosy.server.outputs import EngineStats, LoRAStats
from argosy.server.spec_decode.speculator import Speculator
from argosy.server.structured.grammar_compiler import GrammarCompiler
from argosy.server.text.tokenizer import Tokenizer

log = logging.getLogger("argosy.engine")
GRAMMAR_POLL_SECONDS = 0.01  # how long a step with nothing else to run waits for a compile


class EngineCore:
    def __init__(self, config: EngineConfig, executor: Executor | None = None):
        path = resolve_model_path(config.model)
        self.model_config = ModelConfig.from_folder(path)
        self.limits = resolve_limits(config, self.model_config)
        tokenizer_folder = tokenizer_path(config, path)
        eos = self.model_config.eos_token_ids or _tokenizer_eos(Tokenizer(tokenizer_folder))
        self.eos_token_ids = frozenset(eos)
        hasher = BlockHasher.from_env(config.prefix_caching_hash_algo)
        self.kv_events = None  # bound first: an endpoint in use fails the start before the model loads
        if (events_config := config.kv_events) is not None and events_config.publishes:
            self.kv_events = ZmqEventPublisher(events_config)
            # A replica that restarts holds nothing: whoever still subscribes forgets what it held.
            self.kv_events.publish(EventBatch(time.time(), [AllBlocksCleared()], 0))
            endpoint = self.kv_events.bound_endpoints[0]
            described = hasher.describe()
            log.info("KV events on %s; block hashes: %s; block size %d", endpoint, described, config.block_size)
        self.executor = executor or make_executor(config, self.model_config, self.limits, tuple(eos))
        self.device = self.executor.start()
        log.info(self.device.startup)  # here, not in the worker: the driver may run on another node
        self.grammars = GrammarGate(
            GrammarCompiler(
                tokenizer_folder,
                self.model_config.vocab_size,
                list(eos),
                config.structured_outputs_compile_timeout,
                config.structured_outputs_max_whitespace,
            )
        )
        connector = None
        if (transfer := config.kv_transfer) is not None:
            connector = connector_class(transfer).scheduler(
                transfer, self.device.kv_connector_blocks, config.block_size, self.device.kv_connector_address
            )
        events = None if self.kv_events is None else KVEventRecorder(config.block_size)
        self.kv = KVCacheManager(
            self.device.num_blocks, config.block_size, config.enable_prefix_caching, connector, events, hasher
        )
        self.lora = None
        if config.enable_lora:
            adapters = AdapterHostCache(self.executor, config.max_cpu_loras or config.max_loras)
            self.lora = LoRAManager(adapters, LoRASlots(config.max_loras))
        self.speculator = _speculator(config, self.limits.max_model_len)
        self.scheduler = Scheduler(
            self.kv,
            config.max_num_seqs,
            self.limits.max_num_batched_tokens,
            config.enable_chunked_prefill,
            self.lora,
            self.speculator,
            config.scheduling_policy,
            config.pipeline_parallel_size,
        )
        self.planner = StepPlanner(self.scheduler)
        self.requests: dict[str, Request] = {}
        self._seq_ids = itertools.count()
        self.parallel_sampling = ParallelSampling(self.scheduler, self._seq_ids)
        self._failed: list[RequestFailed] = []
        # A decode planned before its last token is known carries a placeholder that the device side
        # fills in: with one rank, which holds the sampled tokens (other ranks do not sample).
        self._placeholders = config.async_scheduling and config.ranks == 1
        # Steps left launched and not landed when a step returns: none, one with async scheduling, and
        # with pipeline parallelism P - 1, so that P micro-batches are in the stages at once.
        pipeline = config.pipeline_parallel_size
        self.steps_in_flight = pipeline - 1 if pipeline > 1 else int(config.async_scheduling)
        self._in_flight: deque[InFlightStep] = deque()  # launched, not landed, oldest first
        self._landed: list[EngineCoreOutput] = []  # of a step landed between steps, for the next
        self.asleep = False  # no KV cache (or no weights either) until wake_up

    def add_request(self, new: EngineCoreRequest) -> None:
        if new.request_id in self.requests:
            raise InvalidRequestError(f"request id {new.request_id!r} is already in use", param="request_id")
        if self.asleep:
            raise InvalidRequestError("the engine is asleep: wake it up first")
        request = Request(new.request_id, new.prompt_token_ids, new.params, new.arrival_time, options=new.options)
        if request.lora is not None:
            if self.lora is None:
                message = f"adapter {request.lora.name!r} was asked for, but LoRA is off (start with --enable-lora)"
                raise InvalidRequestError(message, param="model")
            self.lora.add(request)  # raises (nothing held) when the adapter cannot be read
        if new.params.structured_outputs is not None:
            # The compile's client: its user, or where it came from (bounded shares of the compiles).
            self.grammars.add(request, new.options.compile_client)
        seq = Sequence(next(self._seq_ids), request, 0, request.prompt_token_ids)
        request.seqs.append(seq)
        self.requests[request.request_id] = request
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Withdraws a request; its blocks are free when this returns. False if it was not in
        flight (unknown, or finished already)."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        for seq in request.seqs:
            if not seq.is_finished:
                seq.finish_reason = seq.finish_reason or "abort"
                self.scheduler.finish(seq)
        self._remove(request)
        return True

    def finish_sequences(self, sequences: list[tuple[str, int]]) -> None:
        """Ends sequences the API process saw finish on a stop string."""
        for request_id, index in sequences:
            request = self.requests.get(request_id)
            if request is None or index >= len(request.seqs) or request.seqs[index].is_finished:
                continue
            seq = request.seqs[index]
            seq.finish_reason = "stop"
            self.scheduler.finish(seq)
            if request.is_finished:
                self._remove(request)

    def _remove(self, request: Request) -> None:
        """The one way a request leaves: what it held goes back."""
        del self.requests[request.request_id]
        if self.lora is not None:
            self.lora.remove(request)
        self.grammars.remove(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._in_flight) or bool(self._landed)

    def load_adapter(self, ref: AdapterRef) -> None:
        """An adapter registered while serving: into host memory now, served again if retired."""
        self._lora_on().load(ref)

    def retire_adapter(self, digest: str) -> None:
        """No name stands for these weights any more: they leave once no request uses them."""
        self._lora_on().retire(digest)

    def _lora_on(self) -> LoRAManager:
        if self.lora is None:
            raise InvalidRequestError("LoRA is off (start with --enable-lora)", param="lora_name")
        return self.lora

    def update_weights(self, path: str) -> None:
        """The checkpoint at `path` serves from now on; the prefix cache, computed with the old
        weights, is emptied. Raises (changing nothing) for a checkpoint that does not match."""
        self._check_idle("update the weights")
        self.executor.update_weights(path)
        self._reset_cache()

    def sleep(self, level: int) -> int:
        """Frees the KV cache (its blocks' contents go, and the prefix cache with them) and,
        with level 2, the weights; returns the bytes freed."""
        if level not in (1, 2):
            raise InvalidRequestError(f"level must be 1 or 2, got {level}", param="level")
        self._check_idle("sleep")
        freed = self.executor.sleep(level)
        self._reset_cache()
        self.asleep = True
        return freed

    def wake_up(self) -> None:
        self.executor.wake_up()
        self.asleep = False

    def _check_idle(self, what: str) -> None:
        self.drain()
        if self.requests:
            raise InvalidRequestError(f"cannot {what} with {len(self.requests)} requests in flight")

    def reset_prefix_cache(self) -> bool:
        """Empties the prefix cache (False, changing nothing, while requests hold blocks)."""
        self.drain()
        return self._reset_cache()

    def _reset_cache(self) -> bool:
        """Empties the prefix cache and tells subscribers at once (they must not route to what is gone)."""
        reset = self.kv.reset_cache()
        self.publish_kv_events()
        return reset

    def num_requests(self) -> tuple[int, int]:
        """(waiting, running) in requests, not sequences: a request with a sequence waiting
        (a new one, or preempted) counts as waiting."""
        waiting = {seq.request.request_id for seq in self.scheduler.waiting}
        running = {seq.request.request_id for seq in self.scheduler.running} - waiting
        return len(waiting), len(running)

    def step(self) -> list[EngineCoreOutput]:
        """One step launched and one landed: the same step, or, with async scheduling or a
        pipeline, the oldest in flight while the new one runs. Returns the landed step's outputs."""
        try:
            return self._step()
        finally:
            self.publish_kv_events()

    def publish_kv_events(self) -> None:
        """Hands what the KV cache did since the last call to the publisher (it never blocks)."""
        if self.kv_events is not None and (events := self.kv.take_events()):
            self.kv_events.publish(EventBatch(time.time(), events, 0))

    def shutdown(self) -> None:
        """Stops the workers, and the KV event publisher after sending what it holds."""
        self.executor.shutdown()
        if self.kv_events is not None:
            self.kv_events.close()

    def _step(self) -> list[EngineCoreOutput]:
        self._check_grammars()
        launched = self._launch()
        if launched is not None:
            self._in_flight.append(launched)
        outputs, self._landed = self._landed, []
        if len(self._in_flight) > self.steps_in_flight or (launched is None and self._in_flight):
            return outputs + self._land(self._in_flight.popleft())
        if launched is None:
            if self.grammars.proving:  # nothing else to run: a moment for the compiles, then the loop goes on
                self.grammars.wait(GRAMMAR_POLL_SECONDS)
            elif self.scheduler.has_work():
                raise RuntimeError("the scheduler could not schedule any waiting sequence")
        return outputs

    def _launch(self) -> InFlightStep | None:
        """The next step scheduled, planned and started; None when there is nothing to run."""
        added = []
        if self._placeholders and self._in_flight:  # its sampled sequences decode next too
            added = self.scheduler.add_placeholders(self._in_flight[-1].completing, self.limits.max_model_len)
        scheduled = self.scheduler.schedule()
        if added:
            running = {id(item.seq) for item in scheduled.scheduled}
            self.scheduler.drop_placeholders([seq for seq in added if id(seq) not in running])
        if not scheduled.has_work and not (
            self.grammars.device_busy or self.scheduler.loading or self.kv.connector_busy
        ):
            return None
        now = time.monotonic()
        for item in scheduled.scheduled:
            item.seq.request.first_scheduled_time = item.seq.request.first_scheduled_time or now
        completing = [item.seq for item in scheduled.scheduled if item.completes]
        forks = self.parallel_sampling.forks(completing)
        plan = self.planner.plan(scheduled, completing, forks)  # with nothing scheduled: it carries and polls
        plan.grammars = self.grammars.take_to_send()
        try:
            handle = self.executor.execute_async(plan) if self.steps_in_flight else Done(self.executor.execute(plan))
        except Exception:
            self._forget_loads(plan)
            raise
        if self.steps_in_flight:  # every computed token stays (no drafts): counted now, so the next plan follows
            self.scheduler.advance(scheduled)
        return InFlightStep(scheduled, plan, completing, forks, handle)

    def _land(self, step: InFlightStep) -> list[EngineCoreOutput]:
        """Takes in a step's result: what its compiles and loads did, then its tokens."""
        try:
            result = step.handle.result()
        except Exception:
            self._forget_loads(step.plan)
            while self._in_flight:  # they ran on a device that failed a step: their results are not taken in
                later = self._in_flight.popleft()
                with contextlib.suppress(Exception):
                    later.handle.result()
                self._forget_loads(later.plan)
            raise
        for failure in self.grammars.device_side(result):
            self.abort(failure.request_id)
            self._failed.append(failure)
        if result.kv_connector is not None:
            self.scheduler.kv_loads_done(result.kv_connector)
            self._fail_refused_pulls()
        # Before the forks: the children take the parent's progress (with async scheduling, counted at launch).
        if not self.steps_in_flight:
            self.scheduler.advance(step.scheduled, self._kept(step.scheduled, step.plan, result))
        targets = self.parallel_sampling.targets(step.completing, step.forks)
        if self.speculator is not None:
            self.speculator.keep_proposals(targets, result.drafts)
        return self._append_sampled(targets, result)

    def _fail_refused_pulls(self) -> None:
        """A pull the prefill side refused: the request's kv_transfer_params are forged or stale (a 4xx)."""
        for request_id, why in self.kv.connector.take_refused():
            if self.abort(request_id):
                self._failed.append(RequestFailed(request_id, why, True, "kv_transfer_params"))

    def poll_connector(self) -> list[EngineCoreOutput]:
        """An idle engine's step while its KV connector waits on others: what was pulled from it is
        let go of, holds expire, pulls land."""
        return self.step() if self.kv.connector_busy else []

    def _forget_loads(self, plan: StepPlan) -> None:
        if self.lora is not None:  # a slot's load may not have happened
            self.lora.slots.forget([slot for slot, _ in plan.lora_loads])

    def drain(self) -> None:
        """Lands the steps in flight, if any (their outputs go out with the next step's)."""
        while self._in_flight:
            self._landed += self._land(self._in_flight.popleft())

    def _kept(self, scheduled: SchedulerOutput, plan: StepPlan, result: StepResult) -> list[int] | None:
        """How many of each scheduled sequence's computed tokens stay: a draft's accepted
        tokens (the step's new tokens but the last), and all the others' (None: all of all)."""
        if self.speculator is None or not any(item.draft for item in scheduled.scheduled):
            return None
        new_tokens = {
            sample.seq_id: (tokens, error)
            for sample, tokens, error in zip(plan.samples, result.token_ids, result.errors)
        }
        kept = []
        for item in scheduled.scheduled:
            if not item.draft:
                kept.append(item.num_new_tokens)
                continue
            tokens, error = new_tokens[item.seq.seq_id]
            accepted = 0 if error is not None else len(tokens) - 1
            self.speculator.record(item.seq, len(item.draft), accepted)
            kept.append(item.num_new_tokens - len(item.draft) + accepted)
        return kept

    def _check_grammars(self) -> None:
        """Fails the requests whose grammar failed or took too long to compile."""
        for request, exc in self.grammars.check(time.monotonic()):
            self.abort(request.request_id)
            self._failed.append(RequestFailed.of(request.request_id, exc))

    def _append_sampled(self, targets: list[Sequence], result: StepResult) -> list[EngineCoreOutput]:
        """Each target's new tokens; a target that could not be sampled, or whose stop check
        failed, fails its request alone (`take_failed`), and the request's other outputs go."""
        outputs, failed, complete = [], {}, set(result.complete)
        for row, (seq, token_ids, logprobs, error) in enumerate(
            zip(targets, result.token_ids, result.logprobs, result.errors)
        ):
            request_id = seq.request.request_id
            if request_id in failed or seq.is_finished:  # it ended while its step ran (async scheduling)
                continue
            if error is None:
                try:
                    outputs.append(self._append(seq, token_ids, logprobs, row in complete))
                    continue
                except Exception as exc:
                    log.exception("checking the new token of request %s failed", request_id)
                    error = f"checking the new token failed: {type(exc).__name__}: {exc}"
            failed[request_id] = error
        for request_id, message in failed.items():
            log.error("request %s failed: %s", request_id, message)
            self.abort(request_id)
            self._failed.append(RequestFailed(request_id, message))
        return [out for out in outputs if out.request_id not in failed] if failed else outputs

    def take_failed(self) -> list[RequestFailed]:
        """The requests that failed alone since the last call (they are no longer in flight)."""
        failed, self._failed = self._failed, []
        return failed

    def check_device(self) -> None:
        """Raises if the device can no longer run a step (after a step failed: a broken device,
        not a broken batch)."""
        self.executor.check_device()

    def _append(
        self, seq: Sequence, token_ids: list[int], logprobs: list[TokenLogprobs] | None, complete: bool = False
    ) -> EngineCoreOutput:
        """Appends the new tokens up to the first that ends the sequence; the rest are dropped.
        `complete`: its grammar allows nothing after them, so the last one ends it (stop)."""
        request = seq.request
        reason = stop_token = None
        if seq.num_pending:  # the placeholder of the token landing now
            del seq.token_ids[-seq.num_pending :]
            seq.num_pending = 0
        for kept, token_id in enumerate(token_ids, start=1):
            seq.token_ids.append(token_id)
            reason, stop_token = finish_reason(seq, token_id, self.eos_token_ids, self.limits.max_model_len)
            if reason is None and complete and kept == len(token_ids):
                reason = "stop"
            if reason is not None:
                token_ids, logprobs = token_ids[:kept], logprobs and logprobs[:kept]
                seq.finish_reason, seq.stop_reason = reason, stop_token
                self.scheduler.finish(seq)
                if request.is_finished:
                    self._remove(request)
                break
        out = EngineCoreOutput(request.request_id, seq.index, token_ids, logprobs, reason, stop_token)
        if reason is not None and self.kv.connector is not None:
            out.kv_transfer_params = self.kv.connector.transfer_params(seq)
        if seq.num_output_tokens == len(token_ids):  # its first tokens
            out.num_cached_tokens, out.first_scheduled_time = request.num_cached_tokens, request.first_scheduled_time
        return out

    def stats(self) -> EngineStats:
        connector = self.kv.connector
        return EngineStats(
            num_waiting=len(self.scheduler.waiting),
            num_running=len(self.scheduler.running),
            kv_blocks_total=self.kv.num_blocks,
            kv_blocks_used=self.kv.num_used_blocks,
            prefix_cache_queries=self.kv.prefix_cache_queries,
            prefix_cache_hits=self.kv.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            preemptions=dict(self.scheduler.preemptions),
            recomputed_tokens=self.scheduler.recomputed_tokens,
            kv_host=connector.stats() if isinstance(connector, HostTierScheduler) else None,
            lora=None if self.lora is None else self._lora_stats(),
            grammar_compile_seconds=self.grammars.compiler.take_compile_seconds(),
            spec_decode=None if self.speculator is None else self.speculator.snapshot(),
            kv_transfer=copy.copy(self.kv.connector.stats)
            if isinstance(self.kv.connector, TransferScheduler)
            else None,
            kv_events_dropped=0 if self.kv_events is None else self.kv_events.dropped,
            kv_blocks_pinned=self.kv.pool.num_pinned,
        )

    def _lora_stats(self) -> LoRAStats:
        def names(seqs) -> list[str]:
            return sorted({s.request.lora.name for s in seqs if s.request.lora is not None})

        loaded, scheduler = self.lora.loaded(), self.scheduler
        running, waiting = names(scheduler.running), names(scheduler.waiting)
        return LoRAStats(len(self.lora.slots.refs), running, waiting, loaded["device"], loaded["host"])


def _speculator(config: EngineConfig, max_model_len: int) -> Speculator | None:
    spec = config.speculative
    return None if spec is None else Speculator(spec, max_model_len)


def _tokenizer_eos(tokenizer: Tokenizer) -> tuple[int, ...]:
    return tuple(t for t in (tokenizer.eos_token_id,) if t is not None)
