"""Autoscaling policies compared in the fleet simulator, on this machine's engine profile.

    python bench/autoscaling.py [--profile profile.json] [--pod-start-seconds 100] [--plots DIR]

Two loads: llm-d's bursty benchmark (15 -> 2 -> 10 -> 15 -> 5 -> 2 requests/s, five minutes each)
with its rates scaled to one replica of the profile (--scale: the rates are multiplied by it, so
that the peak needs about as many replicas as it does on llm-d's GPUs), and a diurnal load (a sine
between --diurnal-low and --diurnal-high over two periods of an hour). Per load:

- `queue`: the operator's ScaledObject with targetWaitingRequests 5 (the guessed threshold);
- `objectives`: the thresholds derived from the objectives (--ttft, --itl) and the profile;
- `+ warm pool`: the same with --warm-pool pods kept asleep, woken in --wake-seconds (their time
  asleep counts in the replica-seconds: they hold their accelerators);
- `fixed at peak`: no autoscaling, the replicas of the busiest minute all the time;
- `lower bound`: the perfect-knowledge fleet's replica-seconds (each minute's replicas known in
  advance and started at once).

Every fleet starts as it stood before the load began: serving with the replicas its first minute
needs (the lower bound's), then scaling between minReplicas 1 and --max-replicas with
--pod-start-seconds pod starts. The profile is made with `argosy profile` when the file is missing
(about eight minutes on two CPU cores)."""

from __future__ import annotations

import argparse
import itertools
import subprocess
import sys
from pathlib import Path

from argosy.operator.objectives import thresholds_for
from argosy.operator.spec import InferenceServiceSpec
from argosy.server.profile.engine_profile import EngineProfile
from argosy.simulator.lower_bound import lower_bound_replica_seconds, replicas_needed
from argosy.simulator.plots import write_plots
from argosy.simulator.simulation import Simulation, SimulationConfig, SimulationResult
from argosy.simulator.summary import Objectives
from argosy.simulator.workload import generate

BURSTY_RATES = (15, 2, 10, 15, 5, 2)


def service(objectives: dict | None, max_replicas: int, router: str, fixed: int | None = None) -> InferenceServiceSpec:
    """Scaled on the queue (no objectives), on the objectives, or `fixed` replicas."""
    autoscaling = {"minReplicas": 1, "maxReplicas": max_replicas, "prometheusAddress": "http://prometheus:9090"}
    if objectives is None:
        autoscaling["targetWaitingRequests"] = 5
    else:
        autoscaling["objectives"] = objectives
    spec = {"model": {"name": "m", "path": "m", "hostPath": "/m"}}
    spec |= {"replicas": fixed} if fixed is not None else {"autoscaling": autoscaling}
    if router == "flow_control":  # behind the Endpoint Picker: its held requests are a trigger too
        spec["routing"] = {"endpointPicker": {"name": "picker"}}
    return InferenceServiceSpec.model_validate(spec)


def reversals(result: SimulationResult, window: float = 300) -> int:
    events = result.scale_events
    return sum(1 for a, b in itertools.pairwise(events) if (a[2] - a[1]) * (b[2] - b[1]) < 0 and b[0] - a[0] < window)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="profile.json")
    parser.add_argument("--pod-start-seconds", type=float, default=100)
    parser.add_argument("--scale", type=float, default=0.2, help="bursty rates x this (15 req/s -> 3)")
    parser.add_argument("--phase-seconds", type=float, default=300)
    parser.add_argument("--diurnal-low", type=float, default=0.2)
    parser.add_argument("--diurnal-high", type=float, default=3.0)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--ttft", type=float, default=3.0)
    parser.add_argument("--itl", type=float, default=0.15)
    parser.add_argument("--max-replicas", type=int, default=16)
    parser.add_argument("--router", default="flow_control", help="round_robin, least_requests, flow_control")
    parser.add_argument("--warm-pool", type=int, default=4)
    parser.add_argument("--wake-seconds", type=float, default=1.0)
    parser.add_argument("--plots", default=None, help="a folder for each run's plots")
    args = parser.parse_args()
    if not Path(args.profile).is_file():
        # Steps of at most 256 tokens: a 2048-token chunk takes about 2 s on a CPU, above any ITL objective.
        profile_command = [sys.executable, "-P", "-m", "argosy.cli", "profile", "--max-num-batched-tokens", "256"]
        subprocess.run([*profile_command, "--output", args.profile], check=True)
    profile = EngineProfile.load(args.profile)
    objectives = {
        "timeToFirstTokenSeconds": args.ttft,
        "interTokenLatencySeconds": args.itl,
        "promptTokens": args.prompt,
        "outputTokens": args.output,
        "profileConfigMap": "profile",
    }
    derived = thresholds_for(profile, service(objectives, args.max_replicas, args.router).autoscaling.objectives)
    lengths = f"prompt={args.prompt},output={args.output}"
    rates = "/".join(f"{r * args.scale:g}" for r in BURSTY_RATES)
    loads = {
        "bursty": f"phases:rates={rates},seconds={args.phase_seconds:g},{lengths},seed=1",
        "diurnal": f"diurnal:low={args.diurnal_low},high={args.diurnal_high},period=3600,duration=7200,"
        f"{lengths},seed=2",
    }
    header = (
        f"{'load':<9}{'policy':<14}{'in TTFT':>9}{'in SLO':>8}{'errors':>7}{'TTFT p50':>10}{'TTFT p99':>10}"
        f"{'ITL p99':>9}{'replica-s':>11}{'x bound':>9}{'scalings':>9}{'reversals':>10}{'max':>5}"
    )
    rows = []
    for load, spec in loads.items():
        trace = generate(spec)
        needed = replicas_needed(trace, derived.tokens_per_second, 1)
        bound = lower_bound_replica_seconds(trace, derived.tokens_per_second, 1)
        for policy, policy_objectives, pool, fixed in (
            ("queue", None, 0, None),
            ("objectives", objectives, 0, None),
            ("+ warm pool", objectives, args.warm_pool, None),
            ("fixed at peak", None, 0, max(needed)),
        ):
            config = SimulationConfig(
                profile,
                trace,
                service(policy_objectives, args.max_replicas, args.router, fixed),
                Objectives(args.ttft, args.itl),
                router=args.router,
                pod_start_seconds=args.pod_start_seconds,
                warm_pool=pool,
                wake_seconds=args.wake_seconds,
                initial_replicas=needed[0],
            )
            result = Simulation(config).run()
            s = result.summary
            in_ttft = sum(1 for r in result.requests if r.error is None and r.ttft is not None and r.ttft <= args.ttft)
            rows.append(
                f"{load:<9}{policy:<14}{in_ttft / s.requests:>9.1%}{s.slo_attainment:>8.1%}{s.errors:>7}"
                f"{s.ttft_p50:>10.2f}{s.ttft_p99:>10.2f}{s.itl_p99:>9.3f}{s.replica_seconds:>11.0f}"
                f"{s.replica_seconds / bound:>9.2f}{s.scale_events:>9}{reversals(result):>10}{s.max_replicas:>5}"
            )
            print(rows[-1], flush=True)
            if args.plots:
                folder = Path(args.plots) / f"{load}-{policy.removeprefix('+ ').replace(' ', '-')}"
                folder.mkdir(parents=True, exist_ok=True)
                write_plots(result.timeline, config.objectives, folder, f"{load}, {policy}")
        rows.append(f"{load:<9}{'lower bound':<14}{'':>43}{bound:>11.0f}{1:>9.2f}")
    print(f"\nprofile: {profile.machine}")
    print(f"loads: {'; '.join(f'{k} {v}' for k, v in loads.items())}")
    print(f"pods start in {args.pod_start_seconds:g} s; router {args.router}; warm pool {args.warm_pool}")
    print(f"objectives: TTFT {args.ttft} s (p99), ITL {args.itl} s; derived per replica: {derived.as_status()}\n")
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
