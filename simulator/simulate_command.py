"""`argosy simulate`: a service's fleet under a trace, on the engine's profile: prints the
figures, writes DIR/summary.json and the plots in DIR."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from argosy.flags import add_flags, config_from_args, setting

DEFAULT_SERVICE = {
    "model": {"name": "model", "path": "model", "hostPath": "/mnt/models"},
    "autoscaling": {
        "minReplicas": 1,
        "maxReplicas": 8,
        "targetWaitingRequests": 5,
        "prometheusAddress": "http://prometheus:9090",
    },
}


@dataclass
class SimulateOptions:
    trace: str = setting(
        "",
        "a trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens, as Azure's LLM inference traces) or a generator: "
        "poisson:rate=R,duration=S | phases:rates=A/B/C,seconds=S | diurnal:low=L,high=H,period=P,duration=S "
        "(each with optional prompt=, output= mean tokens, spread=, seed=)",
    )
    output_dir: str = setting("simulation", "where summary.json and the plots are written")
    profile: str = setting("profile.json", "the engine's profile (argosy profile writes it)")
    service: str | None = setting(
        None,
        "an InferenceService YAML whose autoscaling (or replicas) is simulated; default: 1 to 8 replicas on 5 waiting",
    )
    replicas: int | None = setting(None, "a fixed replica count instead of the service's autoscaling")
    initial_replicas: int | None = setting(
        None, "replicas serving when the trace starts, as a fleet that stood there a while; default: minReplicas"
    )
    router: str = setting("round_robin", "round_robin, least_requests or flow_control (the Endpoint Picker's)")
    pod_start_seconds: float = setting(100.0, "from a pod's creation to its server answering /health")
    scrape_seconds: float = setting(15.0, "Prometheus' scrape interval")
    request_timeout: float = setting(600.0, "a client gives up on a request with no first token by then")
    warm_pool: int = setting(0, "pods kept asleep (sleep mode level 1) beyond the replicas asked for, woken first")
    wake_seconds: float = setting(1.0, "from asleep to serving")
    ttft_objective: float = setting(2.0, "seconds to the first token within which a request meets its objective")
    itl_objective: float = setting(0.1, "mean seconds between tokens within which a request meets its objective")


def add_simulate_args(parser: argparse.ArgumentParser) -> None:
    add_flags(parser, SimulateOptions)


def simulate(args: argparse.Namespace) -> int:
    from argosy.simulator.plots import write_plots
    from argosy.simulator.progress import SimulatedTimeBar
    from argosy.simulator.simulation import Simulation
    from argosy.simulator.summary import Objectives

    options = config_from_args(SimulateOptions, args)
    try:
        config = simulation_config(options, Objectives(options.ttft_objective, options.itl_objective))
    except (OSError, ValueError) as exc:
        print(f"argosy simulate: {exc}")
        return 2
    folder = Path(options.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with SimulatedTimeBar(config.trace[-1].time) as bar:
        result = Simulation(config).run(bar.advance)
    summary = result.summary.as_dict()
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    write_plots(result.timeline, config.objectives, folder, f"{len(config.trace)} requests, {options.trace}")
    print(format_table(summary))
    print(f"written to {folder}/: summary.json, replicas.png, queue.png, latency.png")
    return 0


def simulation_config(options: SimulateOptions, objectives):
    import yaml

    from argosy.operator.spec import InferenceServiceSpec
    from argosy.server.profile.engine_profile import EngineProfile
    from argosy.simulator.simulation import SimulationConfig
    from argosy.simulator.trace import read_trace
    from argosy.simulator.workload import GENERATORS, generate

    if not options.trace:
        raise ValueError("--trace is needed: a trace CSV or a generator such as poisson:rate=1,duration=600")
    if not Path(options.profile).is_file():
        raise ValueError(f"no profile at {options.profile}: write one with `argosy profile --output {options.profile}`")
    is_generator = options.trace.partition(":")[0] in GENERATORS and not Path(options.trace).exists()
    trace = generate(options.trace) if is_generator else read_trace(options.trace)
    if not trace:
        raise ValueError(f"{options.trace} gives no requests")
    spec = DEFAULT_SERVICE
    if options.service is not None:
        spec = yaml.safe_load(Path(options.service).read_text()).get("spec") or {}
    service = InferenceServiceSpec.model_validate(spec)
    if options.replicas is not None:
        service = service.model_copy(update={"autoscaling": None, "replicas": options.replicas})
    return SimulationConfig(
        EngineProfile.load(options.profile),
        trace,
        service,
        objectives,
        router=options.router,
        pod_start_seconds=options.pod_start_seconds,
        scrape_seconds=options.scrape_seconds,
        request_timeout=options.request_timeout,
        warm_pool=options.warm_pool,
        wake_seconds=options.wake_seconds,
        initial_replicas=options.initial_replicas,
    )


def format_table(summary: dict[str, float | int]) -> str:
    units = {"ttft_p50": "s", "ttft_p99": "s", "itl_p50": "s", "itl_p99": "s", "duration": "s"}
    rows = [f"{'figure':<26}{'value':>14}"]
    for name, value in summary.items():
        shown = (
            f"{value:.1%}" if name == "slo_attainment" else (f"{value:.3f}" if isinstance(value, float) else str(value))
        )
        rows.append(f"{name:<26}{shown + units.get(name, ''):>14}")
    return "\n".join(rows)
