"""Argosy against llama.cpp's server on the same chat requests, side by side in one run, at each
instruction-set level this CPU runs: output tokens/s and time to first token at concurrency 1 and
16, Argosy with and without prompt-lookup speculation, on the default model with 2 threads, its
weights in bfloat16 and in int8 (Argosy's --quantization int8 against llama.cpp's Q8_0).

    python bench/versus_llama_cpp.py --llama-build DIR --gguf bf16=PATH int8=PATH \
        [--levels avx2 avx512_bf16] [--concurrency 1 16] [--max-tokens 96]

The workload is bench/spec_decode.py's input-grounded one: 16 chat requests that rewrite or
repeat a code snippet or a paragraph, greedy, each answer at most --max-tokens tokens (they
stop at their end of sequence: the servers' answers differ in length where their arithmetic
does, so tokens are counted from each response's usage). At concurrency c, c clients each send
their next request when the last one ends; the servers take turns, one running at a time.

A level is held on both sides: Argosy by ARGOSY_CPU_ISA with PyTorch held to the same
instructions (bench/cpu_levels.py), llama.cpp by the one CPU variant of ggml it is given (a
build with every variant, GGML_BACKEND_DL, loads the best one found beside its executable: each
level gets a folder of its own with only that level's). llama.cpp's server builds from the
source package of llama-cpp-python (its vendor/llama.cpp), and its converter (it needs
`pip install sentencepiece`) writes the default model as GGUFs:

    pip download --no-binary :all: --no-deps llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
    cmake -S llama_cpp_python-*/vendor/llama.cpp -B llama-build -DGGML_BACKEND_DL=ON \
        -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build llama-build -j2 --target llama-server ggml-cpu-x64 ggml-cpu-haswell \
        ggml-cpu-skylakex ggml-cpu-cooperlake
    for t in bf16 q8_0; do python llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py \
        ~/.cache/argosy/models/SmolLM2-135M-Instruct --outtype $t --outfile smollm2-$t.gguf; done
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from cpu_levels import PYTORCH_LIMITS
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


# llama.cpp's CPU variant of the same instructions as each level. Not sapphirerapids at the top
# (AMX tiles): on this machine's virtual CPU its Q8_0 path dies of SIGILL, AMX state not granted.
GGML_VARIANTS = {"portable": "x64", "avx2": "haswell", "avx512": "skylakex", "avx512_bf16": "cooperlake"}


def llama_server_at(build: Path, variant: str, folder: Path) -> str:
    """A copy of the build's server and libraries with one CPU variant of ggml: the one it loads."""
    for library in (build / "bin").glob("lib*.so*"):
        if not library.name.startswith("libggml-cpu-") or library.name == f"libggml-cpu-{variant}.so":
            shutil.copy2(library, folder)
    if not (folder / f"libggml-cpu-{variant}.so").exists():
        raise SystemExit(f"{build} has no libggml-cpu-{variant}.so: build the target ggml-cpu-{variant}")
    shutil.copy2(build / "bin" / "llama-server", folder)
    return str(folder / "llama-server")


def servers(llama_server: str, gguf: str, weights: str, slots: int, port: int) -> dict[str, list[str]]:
    argosy = [sys.executable, "-P", "-m", "argosy", "serve", "--port", str(port), "--served-model-name", MODEL]
    argosy += ["--max-num-seqs", str(slots), "--dtype", "bfloat16"]
    if weights == "int8":
        argosy += ["--quantization", "int8"]
    return {
        "llama.cpp": [llama_server, "-m", gguf, "--port", str(port), "--host", "127.0.0.1",
                      "-t", "2", "-tb", "2", "--parallel", str(slots), "-c", str(slots * 2048), "-a", MODEL],
        "argosy": argosy,
        "argosy, ngram": [*argosy, "--speculative-config", json.dumps(NGRAM)],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama-build", type=Path, required=True, help="llama.cpp's build folder (bin/ inside)")
    parser.add_argument(
        "--gguf", nargs="+", required=True, help="WEIGHTS=PATH: bf16=the default model in bfloat16, int8=its Q8_0"
    )
    parser.add_argument("--levels", nargs="+", default=None, help="default: every level this CPU runs")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    from argosy.kernels.cpu_isa import ISA_ENV, machine_levels
    from argosy.server.profile.machine import cpu_line

    ggufs = dict(item.split("=", 1) for item in args.gguf)
    conversations = grounded_conversations()
    port = free_port()
    results: dict[tuple[str, str, str, int], Level] = {}
    variants = {level: GGML_VARIANTS[level] for level in args.levels or machine_levels()}
    for level, variant in variants.items():
        env = {**os.environ, ISA_ENV: level, **PYTORCH_LIMITS[level]}
        with tempfile.TemporaryDirectory() as folder:
            llama_server = llama_server_at(args.llama_build, variant, Path(folder))
            for weights, gguf in ggufs.items():
                for name, command in servers(llama_server, gguf, weights, max(args.concurrency), port).items():
                    with running(command, port, env=env) as url:
                        asyncio.run(run_level(url, conversations[:2], 2, 8))  # warm-up
                        for c in args.concurrency:
                            results[level, weights, name, c] = asyncio.run(
                                run_level(url, conversations, c, args.max_tokens)
                            )
    print(f"\n{cpu_line()}")
    print(
        f"{len(conversations)} input-grounded chat requests, at most {args.max_tokens} tokens each, greedy, 2 threads"
    )
    print("| level (ggml variant) | weights | concurrency | server | output tokens/s | vs llama.cpp | TTFT p50 ms |")
    print("|---|---|--:|---|--:|--:|--:|")
    for level, variant in variants.items():
        for weights in ggufs:
            for c in args.concurrency:
                base = results[level, weights, "llama.cpp", c].tokens_per_s
                for name in ("llama.cpp", "argosy", "argosy, ngram"):
                    run = results[level, weights, name, c]
                    ttft = statistics.median(run.ttft) * 1e3
                    print(
                        f"| {level} ({variant}) | {weights} | {c} | {name} | {run.tokens_per_s:.1f} "
                        f"| {run.tokens_per_s / base:.2f}x | {ttft:.0f} |"
                    )


if __name__ == "__main__":
    main()
