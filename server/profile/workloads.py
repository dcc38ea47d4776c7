"""The steps the profile times: prompts alone (prefill steps of each size), batches decoding at
each context length, and decodes joined by prompts (mixed steps), within the engine's KV cache and
sequence cap. Prompts are random tokens, so nothing is a prefix-cache hit."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from argosy.server.engine.core_protocol import EngineCoreRequest
from argosy.server.engine.engine_core import EngineCore
from argosy.server.profile.shape_recorder import ShapeRecorder
from argosy.server.profile.step_shape import StepShape
from argosy.server.sampling_params import SamplingParams

DECODE_TOKENS = 24  # steps a decode batch decodes together, once all of it is admitted


@dataclass(frozen=True)
class Grid:
    prompt_lengths: tuple[int, ...]
    decode_batches: tuple[tuple[int, tuple[int, ...]], ...]  # (context, batch sizes)
    mixed: tuple[tuple[int, int, int], ...]  # (decoding batch, context, prompt length)
    repeats: int


FULL = Grid(
    prompt_lengths=(16, 64, 128, 256, 512, 1024, 2048),
    decode_batches=((128, (1, 2, 4, 8, 16, 32, 64, 128)), (512, (32, 96)), (1024, (1, 4, 16)), (3072, (1, 4))),
    mixed=((4, 256, 128), (8, 256, 512), (16, 512, 256), (4, 1024, 1024), (64, 384, 384), (128, 256, 256)),
    repeats=2,
)
QUICK = Grid(prompt_lengths=(16, 64), decode_batches=((32, (1, 4)),), mixed=((2, 32, 32),), repeats=1)


class ProfileRun:
    def __init__(self, core: EngineCore, seed: int = 0):
        self.core = core
        self.recorder = ShapeRecorder(core.executor)
        core.executor = self.recorder
        self.samples: list[tuple[StepShape, float]] = []
        self._rng = random.Random(seed)
        self._ids = itertools.count()
        self._capacity = core.kv.num_blocks * core.kv.block_size

    def run(self, grid: Grid, progress: Callable[[str], None] = lambda _: None) -> None:
        self._drive([(64, 4)] * 2, record=False)  # first steps build and warm the kernels
        for length in grid.prompt_lengths:
            progress(f"prompt {length}")
            for _ in range(grid.repeats):
                self._drive([(length, 1)])
        for context, batches in grid.decode_batches:
            for batch in self._fitting(batches, context):
                progress(f"decode {batch} x {context}")
                self._drive([(context, self._decode_steps(batch, context))] * batch)
        for batch, context, prompt in grid.mixed:
            if self._fitting((batch + 2,), context + prompt):
                progress(f"decode {batch} x {context} + prompts of {prompt}")
                self._drive_mixed(batch, context, prompt)

    def _decode_steps(self, batch: int, context: int) -> int:
        """Enough tokens that the whole batch is admitted (a few prompts a step, within the step's
        token budget) before the first of it finishes, then decodes DECODE_TOKENS steps together."""
        return DECODE_TOKENS + -(-batch * context // self.core.limits.max_num_batched_tokens) + 1

    def _fitting(self, batches: tuple[int, ...], context: int) -> list[int]:
        limits = self.core.limits
        if context + DECODE_TOKENS > limits.max_model_len:
            return []
        return [
            b
            for b in batches
            if b <= self.core.scheduler.max_num_seqs and b * (context + DECODE_TOKENS) <= 0.9 * self._capacity
        ]

    def _add(self, length: int, max_tokens: int) -> None:
        vocab = self.core.model_config.vocab_size
        prompt = [self._rng.randrange(vocab) for _ in range(length)]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        self.core.add_request(EngineCoreRequest(f"profile-{next(self._ids)}", prompt, params, time.monotonic()))

    def _step(self, record: bool = True) -> None:
        start = time.perf_counter()
        self.core.step()
        seconds = time.perf_counter() - start
        shapes = self.recorder.take()
        if record and len(shapes) == 1:
            self.samples.append((shapes[0], seconds))

    def _drive(self, requests: list[tuple[int, int]], record: bool = True) -> None:
        for length, max_tokens in requests:
            self._add(length, max_tokens)
        while self.core.has_unfinished_requests():
            self._step(record)

    def _drive_mixed(self, batch: int, context: int, prompt: int) -> None:
        """`batch` sequences decoding, joined by a new prompt every few steps; what is left when
        the steps are taken is aborted (its decoding alone is timed elsewhere)."""
        steps = 3 * DECODE_TOKENS + self._decode_steps(batch, context)
        for _ in range(batch):
            self._add(context, steps + 1)
        for step in range(steps):
            if step % 8 == 4:
                self._add(prompt, 2)
            self._step()
        for request_id in list(self.core.requests):
            self.core.abort(request_id)
