"""Tensor and pipeline parallelism on CPU processes, side by side in one run: the default model at
1 rank in the engine's process (the uni executor), 1 rank in a process of its own (the mp
executor: what sending every step through shared memory costs), 3 ranks (its 9 query heads and 3
KV heads split three ways) and, with --stages, its 30 layers in pipeline stages (each stage of
--sizes ranks); each rank's weight and KV-block bytes (the driver's: the last stage's first
rank), the time of a decode step (batch 1 and 16, and the tokens/s of the 16) and of a prefill,
and each against the first row. On a CPU host the ranks share its cores, so the figures show what
the split costs and that it is correct, not a speed-up: on GPUs each rank has a device of its own,
and stages on several nodes hold a model no node could.

    python bench/tensor_parallel.py [--model PATH] [--sizes 1 3] [--stages 1 2] [--steps 32]
"""

from __future__ import annotations

import argparse
import random
import time

from argosy import LLM, SamplingParams


def timed_steps(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, float, float]:
    """(seconds until every prompt is prefilled; mean seconds of the decode steps after; tokens/s
    of those steps). With pipeline stages a step carries one micro-batch, 1/P of the sequences."""
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    start, produced = time.perf_counter(), {}
    while len(produced) < len(prompts):
        produced |= {out.request_id: len(out.outputs[0].token_ids) for out in engine.step()}
    prefill = time.perf_counter() - start
    start, steps = time.perf_counter(), 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    decode = time.perf_counter() - start
    return prefill, decode / steps, (len(prompts) * max_tokens - sum(produced.values())) / decode


def random_prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = random.Random(0)
    low = min(1000, vocab // 2)  # clear of the special tokens
    return [[rng.randrange(low, vocab) for _ in range(length)] for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint folder; default: the embedded model")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 3], help="ranks; 1 runs in both executors")
    parser.add_argument("--stages", type=int, nargs="+", default=[1], help="pipeline stages, each of every size")
    parser.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    args = parser.parse_args()
    rows = []
    setups = [
        (size, stages, backend)
        for stages in args.stages
        for size in args.sizes
        for backend in (["uni", "mp"] if size * stages == 1 else ["mp"])
    ]
    for size, stages, backend in setups:
        llm = LLM(
            args.model,
            tensor_parallel_size=size,
            pipeline_parallel_size=stages,
            distributed_executor_backend=backend,
            max_num_seqs=16,
        )
        device = llm.engine.core.device
        prompts = random_prompts(llm.engine.core.model_config.vocab_size, 18, args.prompt_tokens)
        timed_steps(llm, prompts[:1], 4)  # warm-up
        one = timed_steps(llm, prompts[1:2], args.steps)
        many = timed_steps(llm, prompts[2:], args.steps)
        rows.append((size, stages, backend, device.weight_bytes, device.kv_block_bytes, one, many))
        del llm
    model = args.model or "the default model"
    print(f"\n{model}; {args.prompt_tokens}-token prompts; {args.steps} decode steps per figure")
    print("| ranks a stage | stages | executor | weights per rank | KV block per rank | prefill, 1 prompt "
          "| decode step, 1 seq | prefill, 16 prompts | decode step, 16 seqs | decode tok/s, 16 seqs |")  # fmt: skip
    print("|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|")
    base = rows[0]
    for size, stages, backend, weights, block, one, many in rows:
        figures = [
            f"{value * 1e3:.{digits}f} ms ({value / first:.2f}x)"
            for value, first, digits in zip((*one[:2], *many[:2]), (*base[5][:2], *base[6][:2]), (0, 1, 0, 1))
        ]
        print(
            f"| {size} | {stages} | {backend} | {weights / 2**20:.0f} MiB | {block / 1024:.0f} KiB | "
            + " | ".join(figures)
            + f" | {many[2]:.0f} ({many[2] / base[6][2]:.2f}x) |"
        )


if __name__ == "__main__":
    main()
