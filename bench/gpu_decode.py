"""End-to-end decode throughput of the engine against the HBM roofline: a Llama-3-8B-shaped
checkpoint with random weights (bench/random_checkpoint.py), served by the offline engine with
its defaults (Triton kernels, CUDA graphs), `batch` sequences decoding together. A decode step
must read every weight once and each sequence's keys and values, so at the card's measured
bandwidth no step can take less than (weights + KV read) / bandwidth: the roofline. The table
gives tokens per second, the roofline's, and the share of it reached; every figure comes from
this one run.

    python bench/gpu_decode.py [--shape llama3-8b] [--batches 1 16 64 256] [--context 1024]
    python bench/gpu_decode.py --dry-run  # on CPU: the toy shape, to check the script
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch
from gpu_kernels import copy_bandwidth  # bench/ is the script's own folder, first on the path
from random_checkpoint import write

from argosy import LLM, SamplingParams
from argosy.server.worker.memory_budget import kv_bytes_per_block
from argosy.server.worker.startup_report import tensor_bytes


def decode_seconds(llm: LLM, batch: int, context: int, steps: int) -> float:
    """Seconds for `steps` decode steps of `batch` sequences whose prompts hold `context` tokens,
    timed after their prefill; each step waits for its tokens on the host."""
    engine = llm.engine
    vocab = engine.core.model_config.vocab_size
    rng = random.Random(batch)
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"d{batch}-{i}", [rng.randrange(2, vocab) for _ in range(context)], params)
    scheduler = engine.core.scheduler
    while scheduler.waiting or any(s.num_output_tokens == 0 for s in scheduler.running):
        engine.step()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    seconds = time.perf_counter() - start
    for request_id in list(engine.requests):
        engine.abort(request_id)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama3-8b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--dry-run", action="store_true", help="the toy shape on CPU: checks the script runs")
    args = parser.parse_args()
    if args.dry_run:
        args.shape, args.batches, args.context, args.steps = "toy", [1, 2], 24, 3
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        write(Path(folder), args.shape, device)
        print(f"random {args.shape} checkpoint written in {time.perf_counter() - start:.1f} s")
        start = time.perf_counter()
        llm = LLM(
            folder,
            max_num_seqs=max(args.batches),
            max_model_len=args.context + args.steps + 16,
            cuda_graph_sizes=args.batches,  # only the sizes measured: a shorter capture
            enable_prefix_caching=False,
            **({"kv_cache_memory": 64 << 20} if args.dry_run else {}),
        )
        print(f"engine started in {time.perf_counter() - start:.1f} s: {llm.engine.core.executor.worker.report.line()}")
        runner = llm.engine.core.executor.worker.runner
        model_cfg = llm.engine.core.model_config
        # Each step reads every weight but the embedding table (a row per token), and the keys
        # and values of every sequence, whose context grows by one a step.
        weights = tensor_bytes(runner.model) - runner.model.embed_tokens.weight.numel() * runner.dtype.itemsize
        kv_per_token = kv_bytes_per_block(model_cfg, 1, runner.dtype)
        bandwidth = copy_bandwidth(device, 1 << (20 if args.dry_run else 30), 1 if args.dry_run else 20)
        print(
            f"\ndecode, {args.shape} (random weights, {weights / 1e9:.2f} GB read a step), context {args.context}, "
            f"{runner.dtype}, {device}; roofline at the measured copy bandwidth, {bandwidth / 1e9:.0f} GB/s"
        )
        print("| batch | ms per step | tokens/s | roofline tokens/s | of roofline |\n|--:|--:|--:|--:|--:|")
        for batch in args.batches:
            seconds = decode_seconds(llm, batch, args.context, args.steps) / args.steps
            kv = batch * (args.context + args.steps / 2) * kv_per_token
            roofline = batch * bandwidth / (weights + kv)
            print(f"| {batch} | {seconds * 1e3:.2f} | {batch / seconds:.0f} | {roofline:.0f} | "
                  f"{batch / seconds / roofline:.0%} |")  # fmt: skip


if __name__ == "__main__":
    main()
