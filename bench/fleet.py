"""A fleet on loopback: several `argosy serve` replicas (the embedded default model) behind the real
vLLM router, and a prefix-heavy multi-tenant chat load played against each routing policy in turn.

    python bench/fleet.py [--replicas 3] [--clients 6] [--policies round_robin cache_aware kv_aware]
                          [--cases base restart pressure two_routers host_tier] [--plot docs/benchmarks/fleet.png]

The load: --tenants system prompts (each about --prefix-words words), and --clients clients sending
at once, each holding conversations of --turns turns with a random tenant, every turn the whole
history plus a new user message (streamed chat completions, --max-tokens tokens each, ignore_eos).
Each replica's KV cache holds --cache-fraction of the tenants' prefixes, so where a request lands
decides whether its prefix is cached. Every policy meets the same load on fresh replicas.

Per run: the fleet's prefix-cache hit rate (device and host-tier hits over prompt tokens, from the
replicas' /metrics), TTFT p50 and p90, ITL p50, output tokens/s, and the load's balance (the busiest
replica's requests over the mean). The cases beyond `base` are those where events should pay and an
approximate prefix tree cannot know: `restart` restarts one replica halfway (its cache gone);
`pressure` has a client outside the router flood one replica with unique prompts (evicting what the
tree believes cached); `two_routers` splits the clients between two routers (each tree sees half);
`host_tier` gives each replica a host KV tier (blocks the device evicts stay findable there)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, start, stop, wait_healthy
from streams import stream

from argosy.server.profile.machine import cpu_line

MODEL = "fleet"
WORDS = [
    "account",
    "balance",
    "billing",
    "cluster",
    "configure",
    "deploy",
    "document",
    "error",
    "export",
    "field",
    "filter",
    "format",
    "gateway",
    "invoice",
    "ledger",
    "limit",
    "metric",
    "network",
    "node",
    "order",
    "payment",
    "pipeline",
    "policy",
    "query",
    "quota",
    "record",
    "region",
    "report",
    "request",
    "schedule",
    "schema",
    "secret",
    "service",
    "session",
    "shipment",
    "storage",
    "subscription",
    "support",
    "table",
    "tenant",
    "ticket",
    "token",
    "update",
    "upload",
    "usage",
    "user",
    "vendor",
    "volume",
    "warehouse",
    "window",
    "workflow",
]


@dataclass
class Replica:
    port: int
    events_port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Result:
    policy: str
    case: str
    hit_rate: float
    ttft: list[float] = field(default_factory=list)
    itl: list[float] = field(default_factory=list)
    tokens: int = 0
    seconds: float = 0.0
    per_replica: list[int] = field(default_factory=list)
    errors: int = 0

    @property
    def imbalance(self) -> float:
        mean = statistics.mean(self.per_replica)
        return max(self.per_replica) / mean if mean else 0.0


def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tenants(count: int, words: int) -> list[str]:
    rng = random.Random(7)
    return [f"You are the assistant of tenant {i}. Their handbook: {text(rng, words)}" for i in range(count)]


def cache_bytes_for(prompts: list[str], fraction: float) -> int:
    """A KV cache holding `fraction` of the tenants' prefixes, counted in the default model's tokens."""
    from argosy.server.models.default_model import resolve_model_path
    from argosy.server.models.model_config import ModelConfig
    from argosy.server.text.tokenizer import Tokenizer

    path = resolve_model_path(None)
    config, tokenizer = ModelConfig.from_folder(path), Tokenizer(path)
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2  # bfloat16 K and V
    return int(fraction * sum(len(tokenizer.encode(p)) for p in prompts) * per_token)


def serve_command(replica: Replica, cache_bytes: int, swap_gib: float) -> list[str]:
    events = {"enable_kv_cache_events": True, "endpoint": f"tcp://*:{replica.events_port}"}
    command = [sys.executable, "-P", "-m", "argosy.cli", "serve", "--port", str(replica.port),
               "--served-model-name", MODEL, "--kv-cache-memory", str(cache_bytes), "--max-model-len", "1024",
               "--kv-events-config", json.dumps(events), "--log-format", "json"]  # fmt: skip
    return command + (["--swap-space", str(swap_gib)] if swap_gib else [])


def router_command(port: int, policy: str, replicas: list[Replica]) -> list[str]:
    return [shutil.which("vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", policy,
            "--worker-urls", *(r.url for r in replicas), "--prometheus-port", str(free_port()),
            "--health-check-interval-secs", "2", "--log-level", "warning"]  # fmt: skip


def scrape(url: str) -> dict[str, float]:
    wanted = ("argosy_prefix_cache_queries_total", "argosy_prefix_cache_hits_total", "argosy_kv_host_hits_total",
              "argosy_request_success_total")  # fmt: skip
    totals = dict.fromkeys(wanted, 0.0)
    with contextlib.suppress(httpx.HTTPError):
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] += sample.value
    return totals


async def chat(client: httpx.AsyncClient, url: str, messages: list[dict], max_tokens: int, result: Result) -> str:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    timing = await stream(client, f"{url}/v1/chat/completions", body)
    if timing is None:
        result.errors += 1
        return ""
    result.ttft.append(timing.ttft)
    result.itl.extend(timing.itl)
    result.tokens += len(timing.itl) + 1
    return timing.text


async def client_loop(index: int, urls: list[str], prompts: list[str], args, result: Result, done: list[int]) -> None:
    rng = random.Random(1000 + index)
    url = urls[index % len(urls)]
    async with httpx.AsyncClient(timeout=300) as client:
        for _ in range(args.conversations):
            messages = [{"role": "system", "content": rng.choice(prompts)}]
            for _ in range(args.turns):
                messages.append({"role": "user", "content": text(rng, args.user_words)})
                reply = await chat(client, url, messages, args.max_tokens, result)
                messages.append({"role": "assistant", "content": reply})
                done[0] += 1


async def flood(url: str, stop_at: asyncio.Event, words: int) -> None:
    """Unique long prompts straight to one replica: what evicts its cache behind the router's back."""
    rng = random.Random(99)
    async with httpx.AsyncClient(timeout=300) as client:
        while not stop_at.is_set():
            body = {"model": MODEL, "prompt": f"{rng.random()} {text(rng, words)}", "max_tokens": 1}
            with contextlib.suppress(httpx.HTTPError):
                await client.post(f"{url}/v1/completions", json=body)


async def play(urls: list[str], prompts: list[str], args, result: Result, halfway=None) -> None:
    done, total = [0], args.clients * args.conversations * args.turns
    loops = [asyncio.create_task(client_loop(i, urls, prompts, args, result, done)) for i in range(args.clients)]
    if halfway is not None:
        while done[0] < total // 2:
            await asyncio.sleep(0.2)
        await halfway()
    await asyncio.gather(*loops)


def run(policy: str, case: str, prompts: list[str], args, logs: Path) -> Result:
    cache_bytes = cache_bytes_for(prompts, args.cache_fraction)
    swap = round(4 * cache_bytes / (1 << 30), 3) if case == "host_tier" else 0.0
    replicas = [Replica(free_port(), free_port()) for _ in range(args.replicas)]
    log = logs / f"{policy}-{case}.log"
    routers: list[subprocess.Popen] = []
    try:
        for replica in replicas:
            replica.process = start(serve_command(replica, cache_bytes, swap), log)
        for replica in replicas:
            wait_healthy(replica.url, replica.process)
        router_ports = [free_port() for _ in range(2 if case == "two_routers" else 1)]
        for port in router_ports:
            routers.append(start(router_command(port, policy, replicas), log))
        router_urls = [f"http://127.0.0.1:{port}" for port in router_ports]
        for url, router in zip(router_urls, routers):
            wait_healthy(url, router, 60)
        time.sleep(3)  # the kv_aware policy's subscribers connect
        before = [scrape(r.url) for r in replicas]
        result = Result(policy, case, 0.0)
        start_time = time.perf_counter()
        asyncio.run(play_case(case, router_urls, replicas, prompts, args, result, cache_bytes, swap, log))
        result.seconds = time.perf_counter() - start_time
        after = [scrape(r.url) for r in replicas]
        queries = sum(a["argosy_prefix_cache_queries_total"] - b["argosy_prefix_cache_queries_total"]
                      for a, b in zip(after, before))  # fmt: skip
        hits = sum(a[k] - b[k] for a, b in zip(after, before)
                   for k in ("argosy_prefix_cache_hits_total", "argosy_kv_host_hits_total"))  # fmt: skip
        result.hit_rate = hits / queries if queries else 0.0
        result.per_replica = [int(a["argosy_request_success_total"] - b["argosy_request_success_total"])
                              for a, b in zip(after, before)]  # fmt: skip
        return result
    finally:
        for process in [*routers, *(r.process for r in replicas)]:
            stop(process)


async def play_case(case, router_urls, replicas, prompts, args, result, cache_bytes, swap, log) -> None:
    if case == "restart":

        async def restart() -> None:
            stop(replicas[0].process)
            replicas[0].process = start(serve_command(replicas[0], cache_bytes, swap), log)
            await asyncio.to_thread(wait_healthy, replicas[0].url, replicas[0].process)

        await play(router_urls, prompts, args, result, restart)
    elif case == "pressure":
        stop_at = asyncio.Event()
        noise = asyncio.create_task(flood(replicas[0].url, stop_at, args.prefix_words))
        await play(router_urls, prompts, args, result)
        stop_at.set()
        await noise
    else:
        await play(router_urls, prompts, args, result)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def table(results: list[Result]) -> str:
    head = ("| policy | case | hit rate | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | tokens/s | busiest/mean | errors |\n"
            "|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    rows = [
        f"| {r.policy} | {r.case} | {r.hit_rate:.2f} | {1000 * statistics.median(r.ttft):.0f} | "
        f"{1000 * percentile(r.ttft, 90):.0f} | {1000 * statistics.median(r.itl):.1f} | "
        f"{r.tokens / r.seconds:.1f} | {r.imbalance:.2f} | {r.errors} |"
        for r in results
    ]
    return "\n".join([head, *rows])


def ratios(results: list[Result]) -> str:
    by = {(r.policy, r.case): r for r in results}
    lines = []
    for case in sorted({r.case for r in results}):
        base = by.get(("round_robin", case))
        for policy in ("cache_aware", "kv_aware"):
            r = by.get((policy, case))
            if base is None or r is None or not base.hit_rate:
                continue
            lines.append(
                f"{case}: {policy} hit rate {r.hit_rate / base.hit_rate:.2f}x round_robin's, TTFT p50 "
                f"{statistics.median(r.ttft) / statistics.median(base.ttft):.2f}x"
            )
    return "\n".join(lines)


def plot(results: list[Result], path: Path) -> None:
    """Hit rate and TTFT p50, grouped by case, a colour per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r.case for r in results))
    policies = list(dict.fromkeys(r.policy for r in results))
    by = {(r.policy, r.case): r for r in results}
    width = 0.8 / len(policies)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for axis, label, value in (
        (axes[0], "fleet prefix-cache hit rate", lambda r: r.hit_rate),
        (axes[1], "TTFT p50 (ms)", lambda r: 1000 * statistics.median(r.ttft)),
    ):
        for i, policy in enumerate(policies):
            xs = [c + i * width for c, case in enumerate(cases) if (policy, case) in by]
            axis.bar(xs, [value(by[policy, case]) for case in cases if (policy, case) in by], width, label=policy)
        axis.set_xticks([c + width * (len(policies) - 1) / 2 for c in range(len(cases))], cases)
        axis.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--tenants", type=int, default=15)
    parser.add_argument("--prefix-words", type=int, default=300)
    parser.add_argument("--user-words", type=int, default=25)
    parser.add_argument("--conversations", type=int, default=4, help="per client")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--cache-fraction", type=float, default=0.4)
    parser.add_argument("--policies", nargs="+", default=["round_robin", "cache_aware", "kv_aware"])
    parser.add_argument("--cases", nargs="+", default=["base"])
    parser.add_argument("--logs", type=Path, default=Path("/tmp/argosy-fleet"))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    args.logs.mkdir(parents=True, exist_ok=True)
    prompts = tenants(args.tenants, args.prefix_words)
    results = []
    for case in args.cases:
        for policy in args.policies:
            results.append(run(policy, case, prompts, args, args.logs))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    print(f"\nCPU: {cpu_line()}; {args.replicas} replicas, {args.clients} clients, {args.tenants} tenants")
    print(table(results))
    print(ratios(results))
    if args.plot is not None:
        plot(results, args.plot)


if __name__ == "__main__":
    main()
