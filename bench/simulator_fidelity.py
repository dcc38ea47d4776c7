"""The simulator against a real fleet: the same trace played against --replicas `argosy serve`
processes (the embedded default model, one thread each, as bench/fleet.py runs them) behind the
real vLLM router (round_robin) on loopback, and simulated with this machine's profile, the same
replica count, the same router policy and the replicas sharing this machine's cores.

    python bench/simulator_fidelity.py [--replicas 3] [--profile profile-1thread.json]

Per trace: median TTFT, median TPOT (each request's mean time between its tokens: the streamed
chunks of random-token prompts do not map one to one onto tokens, the usage counts do), p90 TTFT,
and output tokens/s over the run, real beside simulated; and the mean engine step (the servers'
step histogram, the simulated steps' times), which tells the engine's share of a difference from
the rest's (HTTP, the API processes, the client, all on the same cores). Target: medians and throughput within
15% (10% hoped for). The profile is made when missing, with one thread and the servers' engine
flags (about twenty minutes on one CPU thread)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families
from servers import free_port, start, stop, wait_healthy

from argosy.operator.spec import InferenceServiceSpec
from argosy.server.profile.engine_profile import EngineProfile
from argosy.server.profile.machine import cpu_line
from argosy.simulator.simulation import Simulation, SimulationConfig
from argosy.simulator.summary import Objectives
from argosy.simulator.trace import TraceRequest
from argosy.simulator.workload import generate

ENGINE_FLAGS = ["--max-num-batched-tokens", "256"]
TRACES = {
    "poisson": "poisson:rate=1.5,duration=180,prompt=256,output=64,seed=11",
    "bursts": "phases:rates=0.5/3/0.5/2,seconds=45,prompt=384,output=48,seed=12",
}


@dataclass
class Measured:
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)
    tokens: int = 0
    errors: int = 0
    span: float = 0.0
    step: float = 0.0  # mean engine step


async def one(client: httpx.AsyncClient, url: str, request: TraceRequest, rng: random.Random, into: Measured) -> None:
    body = {
        "model": "default",
        "prompt": [rng.randrange(1000, 40000) for _ in range(request.prompt_tokens)],
        "max_tokens": request.output_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent, first, last, tokens = time.perf_counter(), None, None, 0
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            if response.status_code != 200:
                into.errors += 1
                return
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    last = time.perf_counter()
                    first = first or last
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except httpx.HTTPError:
        into.errors += 1
        return
    if first is None or tokens == 0:
        into.errors += 1
        return
    into.ttfts.append(first - sent)
    if tokens > 1:
        into.tpots.append((last - first) / (tokens - 1))
    into.tokens += tokens


async def replay(url: str, trace: list[TraceRequest]) -> Measured:
    measured, rng = Measured(), random.Random(0)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=200)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        start_time, tasks = time.perf_counter(), []
        for request in trace:
            await asyncio.sleep(max(0.0, start_time + request.time - time.perf_counter()))
            tasks.append(asyncio.create_task(one(client, url, request, rng, measured)))
        await asyncio.gather(*tasks)
        measured.span = time.perf_counter() - start_time
    return measured


def simulate(profile: EngineProfile, trace: list[TraceRequest], replicas: int) -> Measured:
    spec = InferenceServiceSpec.model_validate(
        {"model": {"name": "m", "path": "m", "hostPath": "/m"}, "replicas": replicas}
    )
    config = SimulationConfig(
        profile, trace, spec, Objectives(1.0, 0.1), router="round_robin", host_cores=os.cpu_count()
    )
    sim = Simulation(config)
    result = sim.run()
    pods = sim.deployment.pods + sim.deployment.ended
    step = sum(p.step_seconds for p in pods) / sum(p.steps for p in pods)
    measured = Measured(span=result.summary.duration, step=step)
    for r in result.requests:
        if r.error is not None or r.ttft is None:
            measured.errors += 1
            continue
        measured.ttfts.append(r.ttft)
        if r.gaps:
            measured.tpots.append(sum(r.gaps) / len(r.gaps))
        measured.tokens += r.tokens
    return measured


def figures(m: Measured) -> dict[str, float]:
    return {
        "TTFT p50 (s)": statistics.median(m.ttfts),
        "TTFT p90 (s)": statistics.quantiles(m.ttfts, n=10)[-1],
        "TPOT p50 (s)": statistics.median(m.tpots),
        "output tok/s": m.tokens / m.span,
        "step mean (s)": m.step,
    }


def cpu_seconds(servers: list[subprocess.Popen], router: subprocess.Popen) -> dict[str, float]:
    """CPU seconds used so far by the engine cores (the servers' children), the API processes, the
    router and this client."""

    def used(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    found = {"engine cores": 0.0, "API processes": 0.0}
    for server in servers:
        api = psutil.Process(server.pid)
        found["API processes"] += used(api)
        found["engine cores"] += sum(used(child) for child in api.children(recursive=True))
    found["router"] = used(psutil.Process(router.pid))
    found["client"] = used(psutil.Process())
    return found


def step_totals(urls: list[str]) -> tuple[float, float]:
    """The servers' engine step histograms: (seconds, steps) summed."""
    seconds = steps = 0.0
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
            for sample in family.samples:
                if sample.name == "argosy_engine_step_duration_seconds_sum":
                    seconds += sample.value
                elif sample.name == "argosy_engine_step_duration_seconds_count":
                    steps += sample.value
    return seconds, steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--profile", default="profile-1thread.json")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    args = parser.parse_args()
    if not Path(args.profile).is_file():
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        command = [sys.executable, "-P", "-m", "argosy.cli", "profile", *ENGINE_FLAGS, "--output", args.profile]
        subprocess.run(command, check=True, env=env)
    profile = EngineProfile.load(args.profile)
    logs = Path(tempfile.mkdtemp(prefix="fidelity-"))
    servers, router = [], None
    rows = []
    try:
        urls = []
        for i in range(args.replicas):
            port = free_port()
            command = [sys.executable, "-P", "-m", "argosy.cli", "serve", "--port", str(port),
                       "--served-model-name", "default", *ENGINE_FLAGS]  # fmt: skip
            servers.append(start(command, logs / f"replica-{i}.log"))
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, servers):
            wait_healthy(url, process, timeout=600)
        port = free_port()
        router = start(
            [shutil.which("vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
             "--worker-urls", *urls, "--prometheus-port", str(free_port()), "--log-level", "warning"],
            logs / "router.log",
        )  # fmt: skip
        router_url = f"http://127.0.0.1:{port}"
        wait_healthy(router_url, router, timeout=60)
        asyncio.run(replay(router_url, [TraceRequest(0.0, 64, 8)] * args.replicas))  # first steps warm the kernels
        for name in args.traces:
            trace = generate(TRACES[name])
            before, cpu_before = step_totals(urls), cpu_seconds(servers, router)
            real = asyncio.run(replay(router_url, trace))
            after, cpu_after = step_totals(urls), cpu_seconds(servers, router)
            real.step = (after[0] - before[0]) / (after[1] - before[1])
            cpu = {k: (cpu_after[k] - cpu_before[k]) / real.span for k in cpu_after}
            print(f"{name}: cores busy, by process: " + ", ".join(f"{k} {v:.2f}" for k, v in cpu.items()))
            sim = simulate(profile, trace, args.replicas)
            for (metric, value), simulated in zip(figures(real).items(), figures(sim).values()):
                rows.append((name, metric, value, simulated))
            rows.append((name, "errors", real.errors, sim.errors))
            print(f"{name}: {len(trace)} requests done", flush=True)
    finally:
        stop(router)
        for process in servers:
            stop(process)
    print(f"\nCPU: {cpu_line()}; {args.replicas} replicas of one thread; profile: {profile.machine}")
    print(f"traces: {'; '.join(f'{n} {TRACES[n]}' for n in args.traces)}\n")
    print(f"{'trace':<9}{'figure':<15}{'real':>10}{'simulated':>11}{'error':>8}")
    for name, metric, real_value, sim_value in rows:
        error = "" if metric == "errors" else f"{(sim_value - real_value) / real_value:+.1%}"
        print(f"{name:<9}{metric:<15}{real_value:>10.3f}{sim_value:>11.3f}{error:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
