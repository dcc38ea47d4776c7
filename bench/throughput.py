"""Offline throughput on a mixed workload, Argosy's engine next to Hugging Face `generate` in
static batches, measured in one run; and one decode step next to the time of its matrix
products alone.

    python bench/throughput.py [--num-requests 32] [--max-tokens 128] [--repeats 2] [--model PATH]

The workload: prompts of 32-256 tokens and outputs of 16 to --max-tokens tokens, drawn with a
fixed seed, every request forced to its own length (ignore_eos). Hugging Face runs them in
static batches of --hf-batch, left-padded; a batch runs until its longest request is done and
only each request's own tokens are counted. The decode step: --decode-batch sequences with
contexts of about --context tokens, timed on the engine, against the sum of every linear
layer's product on that many rows (the same weights, dtype and threads). Every timing is the
best of --repeats runs (the decode step and its products: one more), the two sides alternated:
this machine's neighbours only ever add time."""

from __future__ import annotations

import argparse
import random
import time

import torch

from argosy.server.models.linear import Linear


def workload(vocab: int, count: int, max_tokens: int) -> list[tuple[list[int], int]]:
    rng = random.Random(0)
    return [
        (
            [rng.randrange(1000, vocab) for _ in range(rng.randint(32, 256))],
            rng.randint(min(16, max_tokens), max_tokens),
        )
        for _ in range(count)
    ]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_argosy(llm, requests: list[tuple[list[int], int]]) -> float:
    from argosy import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for _, n in requests]
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p, _ in requests], params)
    return time.perf_counter() - start


def run_hf(model, requests: list[tuple[list[int], int]], batch_size: int) -> float:
    pad = model.config.pad_token_id or 0
    start = time.perf_counter()
    for i in range(0, len(requests), batch_size):
        batch = requests[i : i + batch_size]
        width = max(len(p) for p, _ in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=model.device)
        longest = max(n for _, n in batch)
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=longest,
                min_new_tokens=longest,
                pad_token_id=pad,
            )
    sync(model.device)
    return time.perf_counter() - start


def decode_step_seconds(llm, batch: int, context: int, steps: int = 8) -> float:
    """Mean time of an engine step decoding `batch` sequences at about `context` tokens."""
    from argosy import SamplingParams

    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=steps + 4, ignore_eos=True)
    for i in range(batch):
        engine.add_request(f"decode-{i}", [1000 + (i * 7 + j) % 5000 for j in range(context)], params)
    scheduler = engine.core.scheduler
    while scheduler.waiting or any(s.num_output_tokens == 0 for s in scheduler.running):
        engine.step()
    device = engine.core.executor.worker.runner.device
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync(device)
    seconds = (time.perf_counter() - start) / steps
    for request_id in list(engine.requests):
        engine.abort(request_id)
    return seconds


def matmul_seconds(model: torch.nn.Module, rows: int, repeats: int = 8) -> float:
    """The decode step's matrix products alone: every linear layer (and the LM head) on `rows`,
    run as the engine runs them (oneDNN-packed on CPU)."""
    products = [m for m in model.modules() if isinstance(m, Linear)]
    if model.lm_head is None:  # tied to the embeddings
        embed = model.embed_tokens.weight
        products.append(lambda x: torch.nn.functional.linear(x, embed))
    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    width = model.config.hidden_size
    inputs = [torch.randn(rows, getattr(m, "in_features", width), dtype=dtype, device=device) for m in products]
    with torch.inference_mode():
        for x, product in zip(inputs, products):
            product(x)
        sync(device)
        start = time.perf_counter()
        for _ in range(repeats):
            for x, product in zip(inputs, products):
                product(x)
        sync(device)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128, help="the longest output (the shortest: 16)")
    parser.add_argument("--hf-batch", type=int, default=16)
    parser.add_argument("--decode-batch", type=int, default=32)
    parser.add_argument("--context", type=int, default=210)
    parser.add_argument("--repeats", type=int, default=2, help="timings of each (the best is kept)")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from argosy import LLM
    from argosy.server.models.default_model import resolve_model_path

    llm = LLM(args.model, max_num_seqs=max(args.num_requests, args.decode_batch))
    core = llm.engine.core
    path = str(resolve_model_path(args.model))
    hf = (
        AutoModelForCausalLM.from_pretrained(path, dtype=core.executor.worker.runner.dtype)
        .to(core.executor.worker.runner.device)
        .eval()
    )
    requests = workload(core.model_config.vocab_size, args.num_requests, args.max_tokens)
    tokens = sum(n for _, n in requests)
    run_argosy(llm, requests[:2])  # warm-up
    # Alternated, the best of each; the prefix cache is emptied first, so no run reuses an
    # earlier one's prompts.
    ours, theirs = [], []
    for _ in range(args.repeats):
        llm.reset_prefix_cache()
        ours.append(run_argosy(llm, requests))
        theirs.append(run_hf(hf, requests, args.hf_batch))
    ours, theirs = min(ours), min(theirs)
    print(
        f"\n{args.num_requests} requests, prompts {min(len(p) for p, _ in requests)}-"
        f"{max(len(p) for p, _ in requests)} tokens, outputs {min(n for _, n in requests)}-"
        f"{max(n for _, n in requests)} ({tokens} in all), greedy; {core.device.startup}, "
        f"{torch.get_num_threads()} threads"
    )
    print("| system | seconds | output tokens/s | vs HF |\n|---|--:|--:|--:|")
    for name, seconds in (("argosy engine", ours), (f"HF generate, static batches of {args.hf_batch}", theirs)):
        print(f"| {name} | {seconds:.2f} | {tokens / seconds:.1f} | {theirs / seconds:.2f}x |")
    # Alternated, the best of each: this machine's neighbours only ever add time, to either.
    steps, products = [], []
    for _ in range(args.repeats + 1):
        steps.append(decode_step_seconds(llm, args.decode_batch, args.context))
        products.append(matmul_seconds(core.executor.worker.runner.model, args.decode_batch))
    step, products = min(steps), min(products)
    print(f"\n| decode step, batch {args.decode_batch}, context ~{args.context} | ms |\n|---|--:|")
    print(f"| engine step | {step * 1e3:.1f} |\n| its matrix products alone | {products * 1e3:.1f} |")
    print(f"| step / products | {step / products:.2f}x |")


if __name__ == "__main__":
    main()
