"""KV-cache memory: how much of what the paged cache allocates holds tokens, next to a
contiguous reservation of max_model_len per request, and how n samples of one prompt share its
blocks. Counted on the engine's own block tables after every step of a real run.

    python bench/memory.py [--num-requests 32] [--max-model-len 2048] [--model PATH]

The mixed workload: prompts of 32-256 tokens, outputs of 16-128 (eos ignored), greedy."""

from __future__ import annotations

import argparse
import random

from argosy import LLM, SamplingParams


def mixed_workload(llm: LLM, num_requests: int, seed: int = 0) -> tuple[int, int, int, int]:
    """(allocated slots, used slots, contiguously reserved slots, steps), summed over the
    samples taken after each step of the requests that hold blocks."""
    engine = llm.engine
    rng = random.Random(seed)
    vocab = engine.core.model_config.vocab_size
    for i in range(num_requests):
        prompt = [rng.randrange(100, vocab) for _ in range(rng.randint(32, 256))]
        params = SamplingParams(temperature=0.0, max_tokens=rng.randint(16, 128), ignore_eos=True)
        engine.add_request(f"r{i}", prompt, params)
    block_size = engine.config.block_size
    allocated = used = reserved = steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        seqs = [s for s in engine.core.scheduler.running if s.block_table]
        allocated += sum(len(s.block_table) for s in seqs) * block_size
        used += sum(s.num_computed_tokens for s in seqs)
        reserved += len(seqs) * engine.core.limits.max_model_len
        steps += 1
    return allocated, used, reserved, steps


def shared_prompt(llm: LLM, n: int, prompt_len: int) -> tuple[int, int, bool]:
    """After n samples of one prompt have each drawn their first tokens: (physical blocks in use,
    blocks without sharing, whether the prompt's full blocks are the same physical blocks in
    every sample)."""
    engine = llm.engine
    prompt = list(range(100, 100 + prompt_len))
    engine.add_request("shared", prompt, SamplingParams(n=n, temperature=1.0, seed=0, max_tokens=8, ignore_eos=True))
    while (
        not all(s.num_output_tokens >= 2 for s in engine.core.requests["shared"].seqs)
        or len(engine.core.requests["shared"].seqs) < n
    ):
        engine.step()
    seqs = engine.core.requests["shared"].seqs
    full = prompt_len // engine.config.block_size
    once = len({tuple(s.block_table[:full]) for s in seqs}) == 1
    without_sharing = sum(len(s.block_table) for s in seqs)
    in_use = engine.core.kv.num_used_blocks
    engine.abort("shared")
    return in_use, without_sharing, once


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 8])
    parser.add_argument("--samples", type=int, default=16, help="n of the shared-prompt case")
    args = parser.parse_args()
    print(f"\nKV-cache waste, {args.num_requests} requests, sampled after every step")
    print("| cache | block size | allocated token slots | holding tokens | waste |\n|---|--:|--:|--:|--:|")
    for block_size in args.block_sizes:
        llm = LLM(args.model, max_model_len=args.max_model_len, block_size=block_size, enable_prefix_caching=False)
        allocated, used, reserved, _ = mixed_workload(llm, args.num_requests)
        print(f"| paged (argosy) | {block_size} | {allocated} | {used} | {(allocated - used) / allocated:.1%} |")
    print(
        f"| contiguous, max_model_len {args.max_model_len} per request | — | {reserved} | {used} "
        f"| {(reserved - used) / reserved:.1%} |"
    )
    prompt_len = 200
    in_use, without_sharing, once = shared_prompt(llm, args.samples, prompt_len)
    print(f"\nn = {args.samples} samples of one {prompt_len}-token prompt, block size {block_size}, first tokens drawn")
    print("| blocks in use | without sharing | prompt's full blocks stored once |\n|--:|--:|---|")
    print(f"| {in_use} | {without_sharing} | {'yes' if once else 'no'} |")


if __name__ == "__main__":
    main()
