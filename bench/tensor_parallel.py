"""Tensor parallelism on CPU processes, side by side in one run: the default model at 1 and 3
ranks (its 9 query heads and 3 KV heads split three ways), each rank's weight and KV-block
bytes, the time of a decode step (batch 1 and 16) and of a prefill, and the share of rank 0's
step spent in the collectives (the layers' and the embedding's all-reduces and the logits'
gather, timed around each call; it includes waiting for the slowest rank). On a CPU host the
ranks share its cores, so the figures show what the split costs and that it is correct, not a
speed-up: on GPUs each rank has a device of its own.

    python bench/tensor_parallel.py [--model PATH] [--sizes 1 3] [--steps 32]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time

from argosy import LLM, SamplingParams
from argosy.server.worker.startup_report import tensor_bytes


class CollectiveTimer:
    """Wraps every collective of rank 0's model, adding up the seconds spent in them."""

    def __init__(self, model) -> None:
        self.seconds = 0.0
        for layer in model.layers:
            for part in (layer.self_attn, layer.mlp):
                if part.all_reduce is not None:
                    part.all_reduce = self._timed(part.all_reduce)
        if model.vocab is not None:
            vocab = model.vocab
            model.vocab = dataclasses.replace(
                vocab, all_reduce=self._timed(vocab.all_reduce), gather=self._timed(vocab.gather)
            )

    def _timed(self, reduce):
        def timed(x):
            start = time.perf_counter()
            out = reduce(x)
            self.seconds += time.perf_counter() - start
            return out

        return timed


def timed_steps(
    llm: LLM, prompts: list[list[int]], max_tokens: int, timer: CollectiveTimer
) -> tuple[float, float, float]:
    """(seconds until every prompt is prefilled; mean seconds of the decode steps after; the
    collectives' share of those)."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    start, started = time.perf_counter(), set()
    while len(started) < len(prompts):
        started |= {out.request_id for out in engine.step()}
    prefill = time.perf_counter() - start
    timer.seconds, start, steps = 0.0, time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    decode = time.perf_counter() - start
    return prefill, decode / steps, timer.seconds / decode


def random_prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = random.Random(0)
    low = min(1000, vocab // 2)  # clear of the special tokens
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint folder; default: the embedded model")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    args = parser.parse_args()
    rows = []
    for size in args.sizes:
        llm = LLM(args.model, tensor_parallel_size=size, max_num_seqs=16)
        executor = llm.engine.core.executor
        runner = executor.runner
        prompts = random_prompts(llm.engine.core.model_config.vocab_size, 18, args.prompt_tokens)
        timer = CollectiveTimer(runner.model)
        timed_steps(llm, prompts[:1], 4, timer)  # warm-up
        one = timed_steps(llm, prompts[1:2], args.steps, timer)
        many = timed_steps(llm, prompts[2:], args.steps, timer)
        block = runner.kv_cache[:, :, 0].nbytes
        rows.append((size, tensor_bytes(runner.model), block, one, many))
        del llm, executor, runner
    model = args.model or "the default model"
    print(f"\n{model}; {args.prompt_tokens}-token prompts; {args.steps} decode steps per figure")
    print("| ranks | weights per rank | KV block per rank | prefill, 1 prompt | decode step, 1 seq "
          "| collectives' share | prefill, 16 prompts | decode step, 16 seqs | collectives' share |")  # fmt: skip
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for size, weights, block, one, many in rows:
        print(
            f"| {size} | {weights / 2**20:.0f} MiB | {block / 1024:.0f} KiB | {one[0] * 1e3:.0f} ms | "
            f"{one[1] * 1e3:.1f} ms | {one[2]:.0%} | {many[0] * 1e3:.0f} ms | {many[1] * 1e3:.1f} ms | {many[2]:.0%} |"
        )


if __name__ == "__main__":
    main()
