"""Async scheduling against synchronous steps, side by side in one run: the same workload (prompts
arriving over the run, long ones in chunks, decodes beside them) through the engine with each,
alternated, best of --repeats. With async scheduling the next step is planned and started while
the last one runs, wherever it does not need that step's tokens (the chunks of long prompts,
admissions); a decode waits for its token. On a CPU the device is the host, so little can
overlap; on a GPU the host's planning hides behind the device's step.

    python bench/async_scheduling.py [--model PATH] [--num-requests 32] [--max-tokens 64] [--repeats 2]
"""

from __future__ import annotations

import argparse
import random
import time

from argosy import LLM, SamplingParams


def workload(vocab: int, count: int, max_tokens: int, max_model_len: int) -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    lengths = [n for n in (32, 256, 1024) if n + max_tokens < max_model_len] or [max_model_len // 2]
    return [
        ([rng.randrange(min(1000, vocab // 2), vocab) for _ in range(rng.choice(lengths))],
         rng.randint(min(8, max_tokens), max_tokens))
        for _ in range(count)
    ]  # fmt: skip


def tokens_per_second(llm: LLM, requests: list[tuple[list[int], int]], arrivals: int) -> float:
    """Output tokens per second, the requests added `arrivals` at a time, one batch per step."""
    engine = llm.engine
    pending = list(enumerate(requests))
    start, produced = time.perf_counter(), 0
    while pending or engine.has_unfinished_requests():
        for i, (prompt, max_tokens) in pending[:arrivals]:
            engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        pending = pending[arrivals:]
        produced += sum(len(out.outputs[0].token_ids) for out in engine.step() if out.finished)
    return produced / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint folder; default: the embedded model")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--arrivals", type=int, default=2, help="requests added before each step")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    llms = {
        mode: LLM(args.model, async_scheduling=mode == "async", max_num_batched_tokens=args.max_num_batched_tokens)
        for mode in ("sync", "async")
    }
    core = llms["sync"].engine.core
    requests = workload(core.model_config.vocab_size, args.num_requests, args.max_tokens, core.limits.max_model_len)
    best = dict.fromkeys(llms, 0.0)
    for _ in range(args.repeats):
        for mode, llm in llms.items():
            best[mode] = max(best[mode], tokens_per_second(llm, requests, args.arrivals))
    device = llms["sync"].engine.core.device.startup.split(":")[0]
    print(f"\n{args.num_requests} requests (prompts of 32, 256 or 1024 tokens, outputs up to {args.max_tokens}), "
          f"{args.arrivals} arriving a step, {args.max_num_batched_tokens} tokens a step; {device}")  # fmt: skip
    print("| steps | output tokens/s | vs synchronous |")
    print("|---|--:|--:|")
    for mode in llms:
        print(f"| {mode} | {best[mode]:.1f} | {best[mode] / best['sync']:.2f}x |")


if __name__ == "__main__":
    main()
