"""Prefill/decode disaggregation on loopback: the same mixed load played against two aggregated
replicas and against one prefill plus one decode replica, each fleet behind the real vLLM router
(round robin; its P/D mode for the second), all on the embedded default model.

    python bench/disaggregation.py [--setups aggregated chunked disaggregated] [--chat-clients 4]
                                   [--chats 20] [--long-words 2500] [--long-every 10]
                                   [--plot docs/assets/disaggregation.png]

The load: --chat-clients clients each sending --chats short chats in turn (a question of about
--chat-words words, --chat-tokens tokens out, streamed, ignore_eos), while a long prompt (about
--long-words words of fresh text, so no prefix is ever cached; --long-tokens out) arrives every
--long-every seconds, whatever is in flight (as a fleet's documents do), until the chats are done.
`aggregated` runs the servers' defaults (a prompt's prefill in chunks of up to 2048 tokens),
`chunked` the same fleet with 256-token chunks (the aggregated fleet's own remedy),
`disaggregated` the P/D pair with the ZmqConnector, `disaggregated-nixl` with the NixlConnector.
Reported: the chats' ITL p50, p99 and max and TTFT p50 and p99, the long prompts' TTFT, output
tokens/s, errors; for a P/D pair, the KV moved under the load (from the decode replica's
/metrics) and, for one long prompt alone afterwards, the pull's time and GB/s beside a plain
socket copy of the same bytes between two processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import shutil
import socket
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, start, stop, wait_healthy
from streams import stream

from argosy.server.profile.machine import cpu_line

MODEL = "pd"
WORDS = ["river", "valley", "ledger", "harbour", "engine", "signal", "window", "garden", "market", "winter",
         "lantern", "mountain", "archive", "compass", "meadow", "circuit", "bridge", "thunder", "orchard",
         "canvas"]  # fmt: skip


@dataclass
class Run:
    setup: str
    chat_ttft: list[float] = field(default_factory=list)
    chat_itl: list[float] = field(default_factory=list)
    long_ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    moved: dict[str, float] = field(default_factory=dict)  # the decode replica's transfer counters, under load
    idle: list[dict[str, float]] = field(default_factory=list)  # and for one long prompt alone, after the load


def words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def serve_command(port: int, chunk: int | None, transfer: str | None) -> list[str]:
    command = [sys.executable, "-P", "-m", "argosy.cli", "serve", "--port", str(port), "--served-model-name", MODEL,
               "--kv-cache-memory", str(512 << 20), "--log-format", "json"]  # fmt: skip
    if chunk is not None:
        command += ["--max-num-batched-tokens", str(chunk)]
    if transfer is not None:
        config = {
            "kv_connector": transfer,
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"side_channel_port": free_port()},
        }
        command += ["--kv-transfer-config", json.dumps(config)]
    return command


def router_command(port: int, urls: list[str], disaggregated: bool) -> list[str]:
    workers = ["--vllm-pd-disaggregation", "--prefill", urls[0], "--decode", urls[1]] if disaggregated else [
        "--worker-urls", *urls]  # fmt: skip
    return [shutil.which("vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
            *workers, "--prometheus-port", str(free_port()), "--log-level", "warning"]  # fmt: skip


async def chat_client(index: int, url: str, args, run: Run) -> None:
    rng = random.Random(index)
    async with httpx.AsyncClient(timeout=600) as client:
        for _ in range(args.chats):
            messages = [{"role": "user", "content": f"{index} {words(rng, args.chat_words)}?"}]
            body = {"model": MODEL, "messages": messages, "max_tokens": args.chat_tokens, "temperature": 0.0,
                    "ignore_eos": True}  # fmt: skip
            timing = await stream(client, f"{url}/v1/chat/completions", body)
            if timing is None:
                run.errors += 1
                continue
            run.chat_ttft.append(timing.ttft)
            run.chat_itl += timing.itl
            run.tokens += len(timing.itl) + 1


async def long_prompt(client: httpx.AsyncClient, url: str, prompt: str, args, run: Run) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": args.long_tokens, "temperature": 0.0, "ignore_eos": True}
    timing = await stream(client, f"{url}/v1/completions", body)
    if timing is None:
        run.errors += 1
        return
    run.long_ttft.append(timing.ttft)
    run.tokens += len(timing.itl) + 1


async def long_prompts(url: str, args, run: Run, done: asyncio.Event) -> None:
    """One long prompt every --long-every seconds, each sent whatever the others are doing (open loop)."""
    rng = random.Random(99)
    async with httpx.AsyncClient(timeout=600) as client:
        sent = []
        while not done.is_set():
            prompt = f"{rng.random()} {words(rng, args.long_words)}"
            sent.append(asyncio.create_task(long_prompt(client, url, prompt, args, run)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), args.long_every)
        await asyncio.gather(*sent)


async def play(url: str, args, run: Run) -> None:
    done = asyncio.Event()
    longs = asyncio.create_task(long_prompts(url, args, run, done))
    await asyncio.sleep(1.0)  # the first long prompt is in flight when the chats begin
    await asyncio.gather(*(chat_client(i, url, args, run) for i in range(args.chat_clients)))
    done.set()
    await longs


def transfer_counters(url: str) -> dict[str, float]:
    wanted = {"argosy_kv_transfer_bytes_total": "bytes", "argosy_kv_transfer_seconds_total": "seconds"}
    found = {"bytes": 0.0, "seconds": 0.0, "blocks": 0.0, "pulls": 0.0}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in wanted:
                found[wanted[sample.name]] += sample.value
            elif sample.name == "argosy_kv_transfer_blocks_total" and sample.labels.get("direction") == "pulled":
                found["blocks"] += sample.value
    return found


def run_setup(setup: str, args) -> Run:
    disaggregated = setup.startswith("disaggregated")
    chunk = 256 if setup == "chunked" else None
    transfer = ("NixlConnector" if setup.endswith("nixl") else "ZmqConnector") if disaggregated else None
    ports = [free_port(), free_port()]
    log = args.logs / f"{setup}.log"
    processes = [start(serve_command(port, chunk, transfer), log) for port in ports]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    router = None
    try:
        for url, process in zip(urls, processes):
            wait_healthy(url, process)
        router_port = free_port()
        router = start(router_command(router_port, urls, disaggregated), log)
        router_url = f"http://127.0.0.1:{router_port}"
        wait_healthy(router_url, router, 60)
        run = Run(setup)
        before = transfer_counters(urls[1])
        started = time.perf_counter()
        asyncio.run(play(router_url, args, run))
        run.seconds = time.perf_counter() - started
        after = transfer_counters(urls[1])
        run.moved = {key: after[key] - before[key] for key in after}
        if disaggregated:
            run.idle = [alone(router_url, urls[1], args, seed) for seed in range(3)]
        return run
    finally:
        for process in [router, *processes]:
            stop(process)


def alone(router_url: str, decode_url: str, args, seed: int) -> dict[str, float]:
    """What one long prompt's hand-off moves, and how fast, with nothing else in flight."""
    rng, before = random.Random(1000 + seed), transfer_counters(decode_url)
    body = {"model": MODEL, "prompt": f"{rng.random()} {words(rng, args.long_words)}", "max_tokens": 2}
    httpx.post(f"{router_url}/v1/completions", json=body, timeout=600).raise_for_status()
    after = transfer_counters(decode_url)
    return {key: after[key] - before[key] for key in after}


def _receive(port: int, size: int, ready) -> None:
    with socket.create_server(("127.0.0.1", port)) as server:
        ready.set()
        connection, _ = server.accept()
        with connection:
            left = size
            while left:
                left -= len(connection.recv(min(left, 1 << 20)))
            connection.sendall(b"k")


def socket_copy_seconds(size: int) -> float:
    """One plain TCP copy of `size` bytes on loopback to another process, until it has them all."""
    port, ready = free_port(), multiprocessing.Event()
    receiver = multiprocessing.Process(target=_receive, args=(port, size, ready))
    receiver.start()
    ready.wait(30)
    payload = bytes(size)
    with socket.create_connection(("127.0.0.1", port)) as connection:
        started = time.perf_counter()
        connection.sendall(payload)
        connection.recv(1)
        seconds = time.perf_counter() - started
    receiver.join(30)
    return seconds


def report_transfer(pd: Run) -> None:
    """What the P/D pair moved under the load, and one long prompt's pull alone beside a socket copy."""
    moved = pd.moved
    if not moved["seconds"]:
        return
    print(f"{pd.setup}: KV pulled under the load: {moved['blocks']:.0f} blocks, {moved['bytes'] / 1e6:.1f} MB in "
          f"{moved['seconds']:.2f} s of pulls ({moved['bytes'] / moved['seconds'] / 1e9:.2f} GB/s)")  # fmt: skip
    best = min(pd.idle, key=lambda m: m["seconds"] / m["bytes"])
    size = int(best["bytes"])
    copy = min(socket_copy_seconds(size) for _ in range(3))
    pulled = f"{1000 * best['seconds']:.1f} ms ({size / best['seconds'] / 1e9:.2f} GB/s)"
    copied = f"{1000 * copy:.1f} ms ({size / copy / 1e9:.2f} GB/s, best of 3)"
    print(f"{pd.setup}: one long prompt's pull alone (best of 3): {best['blocks']:.0f} blocks, {size / 1e6:.1f} MB "
          f"in {pulled}; a plain socket copy of the same bytes between two processes: {copied}")  # fmt: skip


def pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def p99(values: list[float]) -> float:
    return pct(values, 99)


def table(runs: list[Run]) -> str:
    rows = ["| setup | chat ITL p50 ms | chat ITL p99 ms | chat ITL max ms | chat TTFT p50 ms | chat TTFT p99 ms "
            "| long TTFT p50 ms | long TTFT p99 ms | tokens/s | errors |",
            "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        ms = [1000 * f(r.chat_itl) for f in (statistics.median, p99, max)]
        ms += [1000 * f(v) for v in (r.chat_ttft, r.long_ttft) for f in (statistics.median, p99)]
        cells = " | ".join(f"{v:.0f}" for v in ms)
        rows.append(f"| {r.setup} | {cells} | {r.tokens / r.seconds:.1f} | {r.errors} |")
    return "\n".join(rows)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"chat ITL p50": lambda r: statistics.median(r.chat_itl), "chat ITL p99": lambda r: pct(r.chat_itl, 99),
              "chat TTFT p50": lambda r: statistics.median(r.chat_ttft),
              "long TTFT p50": lambda r: statistics.median(r.long_ttft)}  # fmt: skip
    fig, axes = plt.subplots(1, len(series), figsize=(14, 3.5))
    for axis, (label, value) in zip(axes, series.items()):
        axis.bar([r.setup for r in runs], [1000 * value(r) for r in runs], color=[f"C{i}" for i in range(len(runs))])
        axis.set_title(f"{label} (ms)")
        axis.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setups", nargs="+", default=["aggregated", "chunked", "disaggregated"],
                        help="also: disaggregated-nixl (the pair with NixlConnector)")  # fmt: skip
    parser.add_argument("--chat-clients", type=int, default=4)
    parser.add_argument("--chats", type=int, default=20, help="per chat client")
    parser.add_argument("--chat-words", type=int, default=30)
    parser.add_argument("--chat-tokens", type=int, default=32)
    parser.add_argument("--long-words", type=int, default=2500)
    parser.add_argument("--long-every", type=float, default=10.0, help="seconds between long prompts")
    parser.add_argument("--long-tokens", type=int, default=8)
    parser.add_argument("--logs", type=Path, default=Path("/tmp/argosy-disaggregation"))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    runs = []
    for setup in args.setups:
        runs.append(run_setup(setup, args))
        print(table(runs[-1:]).splitlines()[-1], flush=True)
    print(f"\nCPU: {cpu_line()}; two replicas per setup, {args.chat_clients} chat clients, one long-prompt client")
    print(table(runs))
    by = {r.setup: r for r in runs}
    for pd in (r for r in runs if r.setup.startswith("disaggregated")):
        for base in ("aggregated", "chunked"):
            if base in by:
                ratio = pct(pd.chat_itl, 99) / pct(by[base].chat_itl, 99)
                print(f"chat ITL p99, {pd.setup} over {base}: {ratio:.2f}x")
        report_transfer(pd)
    if args.plot is not None:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
