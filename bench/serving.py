"""Online latency of `argosy serve`: time to first token (TTFT) and inter-token latency (ITL)
of streamed chat requests at several concurrency levels, measured by a client on loopback.

    python bench/serving.py [--concurrency 1 16] [--requests-per-client 4] [--max-tokens 64]

Starts `argosy serve` on the embedded default model (or uses --url), then for each
concurrency level keeps that many clients busy, each sending requests back to back."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import socket
import statistics
import subprocess
import sys
import time

import httpx

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis briefly.",
    "Write a haiku about rain.",
    "Why is the sky blue?",
    "What is a prime number?",
    "Name three metals.",
    "Who wrote Hamlet?",
    "What causes tides?",
]


async def one_request(
    client: httpx.AsyncClient, model: str, question: str, max_tokens: int
) -> tuple[float, list[float]]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    token_times = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    token_times.append(time.perf_counter())
    ttft = token_times[0] - start
    return ttft, [b - a for a, b in itertools.pairwise(token_times)]


async def run_level(url: str, model: str, concurrency: int, per_client: int, max_tokens: int) -> dict:
    ttfts, itls = [], []

    async def client_loop(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=600) as client:
            for j in range(per_client):
                ttft, gaps = await one_request(client, model, QUESTIONS[(i + j) % len(QUESTIONS)], max_tokens)
                ttfts.append(ttft)
                itls.extend(gaps)

    start = time.perf_counter()
    await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {"ttft": ttfts, "itl": itls, "elapsed": elapsed, "requests": concurrency * per_client}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "argosy", "serve", "--port", str(port), "--log-format", "text"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default=None, help="a running server (default: start one on the default model)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    proc = None
    url = args.url
    if url is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = start_server(port)
        url = f"http://127.0.0.1:{port}"
    try:
        model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
        asyncio.run(run_level(url, model, 1, 1, 8))  # warm-up
        print(f"\nstreamed chat, {args.max_tokens} tokens per request, {args.requests_per_client} requests per client")
        print("| concurrency | requests | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tokens/s |")
        print("|--:|--:|--:|--:|--:|--:|--:|")
        for c in args.concurrency:
            r = asyncio.run(run_level(url, model, c, args.requests_per_client, args.max_tokens))
            tokens = r["requests"] * args.max_tokens
            print(
                f"| {c} | {r['requests']} | {pct(r['ttft'], 50) * 1e3:.0f} | {pct(r['ttft'], 99) * 1e3:.0f} | "
                f"{pct(r['itl'], 50) * 1e3:.1f} | {pct(r['itl'], 99) * 1e3:.1f} | {tokens / r['elapsed']:.1f} |"
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(60)


if __name__ == "__main__":
    main()
