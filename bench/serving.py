"""The offline engine and `argosy serve` on the same requests, side by side in one run: output
tokens/s, time to first token (TTFT) and inter-token latency (ITL) at several concurrency
levels, and the server's throughput as a fraction of the offline engine's.

    python bench/serving.py [--concurrency 1 4 16 64] [--prompt-tokens 564] [--max-tokens 128]

Every request is a distinct prompt of random token ids (so no prefix is shared), decoded
greedily to exactly --max-tokens tokens (ignore_eos). At concurrency c, c clients each send
their next request as soon as the previous one ends: offline, a loop over the engine's steps
plays those clients; online, streaming HTTP clients on loopback do. Writes a PNG plot."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from itertools import pairwise

import httpx
from servers import free_port, running

from argosy import LLM, SamplingParams

MODEL = "bench"


@dataclass
class Level:
    seconds: float
    tokens: int
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def request_set(vocab: int, count: int, length: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(1000, vocab) for _ in range(length)] for _ in range(count)]


def run_offline(llm: LLM, prompts: list[list[int]], concurrency: int, max_tokens: int) -> Level:
    """Closed-loop clients played on the engine's step loop; token times from each step."""
    engine, params = llm.engine, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    queue, sent, times = list(enumerate(prompts)), {}, {}
    start = time.perf_counter()

    def send() -> None:
        index, prompt = queue.pop(0)
        engine.add_request(str(index), prompt, params)
        sent[str(index)], times[str(index)] = time.perf_counter(), []

    for _ in range(min(concurrency, len(queue))):
        send()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            times[out.request_id] += [now] * (len(out.outputs[0].token_ids) - len(times[out.request_id]))
            if out.finished and queue:
                send()
    level = Level(time.perf_counter() - start, sum(len(t) for t in times.values()))
    for request_id, stamps in times.items():
        level.ttft.append(stamps[0] - sent[request_id])
        level.itl += [b - a for a, b in pairwise(stamps)]
    return level


async def one_request(client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> list[float]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    stamps = [time.perf_counter()]
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"]:  # one chunk per step with a new token, its text possibly empty
                    stamps.append(time.perf_counter())
    return stamps


async def run_online(url: str, prompts: list[list[int]], concurrency: int, max_tokens: int) -> Level:
    queue = list(prompts)
    level = Level(0.0, 0)

    async def client_loop() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            while queue:
                sent, *stamps = await one_request(client, queue.pop(0), max_tokens)
                level.ttft.append(stamps[0] - sent)
                level.itl += [b - a for a, b in pairwise(stamps)]

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    level.seconds, level.tokens = time.perf_counter() - start, len(prompts) * max_tokens
    return level


def server_command(port: int, max_num_seqs: int) -> list[str]:
    command = [sys.executable, "-P", "-m", "argosy", "serve", "--port", str(port), "--served-model-name", MODEL]
    return [*command, "--max-num-seqs", str(max_num_seqs)]


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def plot(levels: list[int], offline: list[Level], online: list[Level], path: str) -> bool:
    """Draws the figure after the tables are printed; False where matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print("\nno plot: matplotlib is not installed (pip install matplotlib)")
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, lat) = plt.subplots(1, 2, figsize=(11, 4))
    for name, runs in (("offline engine", offline), ("argosy serve", online)):
        tput.plot(levels, [r.tokens_per_s for r in runs], marker="o", label=name)
        lat.plot(levels, [pct(r.itl, 50) * 1e3 for r in runs], marker="o", label=f"{name}: ITL p50")
        lat.plot(levels, [pct(r.ttft, 50) * 1e3 for r in runs], marker="s", ls="--", label=f"{name}: TTFT p50")
    tput.set(xscale="log", xlabel="concurrency", ylabel="output tokens/s", title="throughput")
    lat.set(xscale="log", yscale="log", xlabel="concurrency", ylabel="ms", title="latency")
    for ax in (tput, lat):
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=0, help="per level; default max(4, 2 x concurrency)")
    parser.add_argument("--prompt-tokens", type=int, default=564)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--plot", default="docs/assets/serving.png")
    args = parser.parse_args()
    max_seqs = max(args.concurrency)
    counts = [args.requests or max(4, 2 * c) for c in args.concurrency]
    llm = LLM(max_num_seqs=max_seqs)
    vocab = llm.engine.core.model_config.vocab_size
    prompt_sets = [request_set(vocab, n, args.prompt_tokens) for n in counts]
    run_offline(llm, prompt_sets[0][:2], 2, 4)  # warm-up
    offline = [run_offline(llm, p, c, args.max_tokens) for p, c in zip(prompt_sets, args.concurrency)]
    del llm
    port = free_port()
    with running(server_command(port, max_seqs), port) as url:
        asyncio.run(run_online(url, prompt_sets[0][:2], 2, 4))  # warm-up
        online = [asyncio.run(run_online(url, p, c, args.max_tokens)) for p, c in zip(prompt_sets, args.concurrency)]
    print(f"\n{args.prompt_tokens} prompt tokens and {args.max_tokens} output tokens per request, default model")
    print("| concurrency | requests | system | output tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|--:|--:|---|--:|--:|--:|--:|--:|")
    for c, n, off, on in zip(args.concurrency, counts, offline, online):
        for name, r in (("offline engine", off), ("argosy serve", on)):
            print(
                f"| {c} | {n} | {name} | {r.tokens_per_s:.1f} | {pct(r.ttft, 50) * 1e3:.0f} | "
                f"{pct(r.ttft, 99) * 1e3:.0f} | {pct(r.itl, 50) * 1e3:.1f} | {pct(r.itl, 99) * 1e3:.1f} |"
            )
    print("\n| concurrency | server / offline throughput |\n|--:|--:|")
    for c, off, on in zip(args.concurrency, offline, online):
        print(f"| {c} | {on.tokens_per_s / off.tokens_per_s:.0%} |")
    if plot(args.concurrency, offline, online, args.plot):
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
