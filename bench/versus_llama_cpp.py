"""Argosy against llama.cpp's server on the same chat requests, side by side in one run: output
tokens/s and time to first token at concurrency 1 and 16, Argosy with and without prompt-lookup
speculation, all on the default model in bfloat16 with 2 threads.

    python bench/versus_llama_cpp.py --llama-server PATH --gguf PATH [--concurrency 1 16] [--max-tokens 96]

The workload is bench/spec_decode.py's input-grounded one: 16 chat requests that rewrite or
repeat a code snippet or a paragraph, greedy, each answer at most --max-tokens tokens (they
stop at their end of sequence: the servers' answers differ in length where their arithmetic
does, so tokens are counted from each response's usage). At concurrency c, c clients each send
their next request when the last one ends; the servers take turns, one running at a time.

llama.cpp's server builds from the source package of llama-cpp-python (its vendor/llama.cpp),
and its converter (it needs `pip install sentencepiece`) writes the default model as a GGUF:

    pip download --no-binary :all: --no-deps llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
    cmake -S llama_cpp_python-*/vendor/llama.cpp -B llama-build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build llama-build --target llama-server -j2
    python llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py \\
        ~/.cache/argosy/models/SmolLM2-135M-Instruct --outtype bf16 --outfile smollm2-bf16.gguf
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

import httpx
from servers import free_port, running
from serving import Level
from spec_decode import grounded_conversations

MODEL = "bench"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}


async def one_request(client: httpx.AsyncClient, messages: list[dict], max_tokens: int) -> tuple[float, int]:
    """(time to first token, completion tokens) of one streamed chat request."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter()
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not tokens:
        raise RuntimeError("the server sent no usage")
    return (first or time.perf_counter()) - start, tokens


async def run_level(url: str, conversations: list[list[dict]], concurrency: int, max_tokens: int) -> Level:
    queue, level = list(conversations), Level(0.0, 0)

    async def client_loop() -> None:
        # A connection per request: llama.cpp's server closes a streamed response's connection,
        # which a pooled client would otherwise try again.
        no_reuse = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=no_reuse) as client:
            while queue:
                ttft, tokens = await one_request(client, queue.pop(0), max_tokens)
                level.ttft.append(ttft)
                level.tokens += tokens

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    level.seconds = time.perf_counter() - start
    return level


def servers(args: argparse.Namespace, port: int) -> dict[str, list[str]]:
    slots = max(args.concurrency)
    argosy = [sys.executable, "-P", "-m", "argosy", "serve", "--port", str(port), "--served-model-name", MODEL]
    argosy += ["--max-num-seqs", str(slots), "--dtype", "bfloat16"]
    return {
        "llama.cpp": [args.llama_server, "-m", args.gguf, "--port", str(port), "--host", "127.0.0.1",
                      "-t", "2", "-tb", "2", "--parallel", str(slots), "-c", str(slots * 2048), "-a", MODEL],
        "argosy": argosy,
        "argosy, ngram": [*argosy, "--speculative-config", json.dumps(NGRAM)],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--gguf", required=True, help="the default model as a bfloat16 GGUF")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    conversations = grounded_conversations()
    port = free_port()
    results: dict[tuple[str, int], Level] = {}
    for name, command in servers(args, port).items():
        with running(command, port) as url:
            asyncio.run(run_level(url, conversations[:2], 2, 8))  # warm-up
            for c in args.concurrency:
                results[name, c] = asyncio.run(run_level(url, conversations, c, args.max_tokens))
    print(f"\n{len(conversations)} input-grounded chat requests, at most {args.max_tokens} tokens each, greedy")
    print("| concurrency | server | output tokens/s | vs llama.cpp | TTFT p50 ms |")
    print("|--:|---|--:|--:|--:|")
    for c in args.concurrency:
        base = results["llama.cpp", c].tokens_per_s
        for name in ("llama.cpp", "argosy", "argosy, ngram"):
            level = results[name, c]
            ttft = statistics.median(level.ttft) * 1e3
            print(f"| {c} | {name} | {level.tokens_per_s:.1f} | {level.tokens_per_s / base:.2f}x | {ttft:.0f} |")


if __name__ == "__main__":
    main()
