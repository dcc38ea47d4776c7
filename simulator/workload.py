"""Generated traces: Poisson arrivals at a fixed rate, bursty phases of different rates, and a
diurnal rate (a sine between a low and a high), the last two as non-homogeneous Poisson processes
(thinning). Token counts are log-normal around their means. Written as specs on the command line:
`poisson:rate=2,duration=600`, `phases:rates=15/2/10/15/5/2,seconds=300`,
`diurnal:low=1,high=8,period=3600,duration=7200`, each with optional `prompt=`, `output=`
(mean tokens), `spread=` (the log-normal's sigma) and `seed=`."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from argosy.simulator.trace import TraceRequest

GENERATORS = ("poisson", "phases", "diurnal")


def generate(spec: str) -> list[TraceRequest]:
    kind, _, rest = spec.partition(":")
    if kind not in GENERATORS:
        raise ValueError(f"unknown workload {kind!r}: one of {', '.join(GENERATORS)}")
    try:
        args = dict(item.split("=", 1) for item in rest.split(",") if item)
    except ValueError:
        raise ValueError(f"workload {spec!r}: settings are name=value, separated by commas") from None
    rng = random.Random(int(args.pop("seed", 0)))
    lengths = _lengths(
        rng, float(args.pop("prompt", 512)), float(args.pop("output", 128)), float(args.pop("spread", 0.5))
    )
    try:
        if kind == "poisson":
            rate = float(args.pop("rate"))
            times = _arrivals(rng, lambda _: rate, rate, float(args.pop("duration")))
        elif kind == "phases":
            rates = [float(r) for r in args.pop("rates").split("/")]
            seconds = float(args.pop("seconds"))
            times = _arrivals(
                rng, lambda t: rates[min(int(t // seconds), len(rates) - 1)], max(rates), seconds * len(rates)
            )
        else:
            low, high, period = float(args.pop("low")), float(args.pop("high")), float(args.pop("period"))
            mid, half = (high + low) / 2, (high - low) / 2
            rate = lambda t: mid - half * math.cos(2 * math.pi * t / period)  # noqa: E731 (low at the start)
            times = _arrivals(rng, rate, high, float(args.pop("duration")))
    except KeyError as exc:
        raise ValueError(f"workload {spec!r} needs {exc.args[0]}=") from None
    if args:
        raise ValueError(f"workload {spec!r}: unknown settings {', '.join(sorted(args))}")
    return [TraceRequest(t, *lengths()) for t in times]


def _arrivals(rng: random.Random, rate: Callable[[float], float], peak: float, duration: float) -> list[float]:
    """Arrival times of a Poisson process of rate `rate(t)` <= `peak`, by thinning."""
    times, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= duration:
            return times
        if rng.random() * peak < rate(t):
            times.append(t)


def _lengths(rng: random.Random, prompt: float, output: float, sigma: float) -> Callable[[], tuple[int, int]]:
    def draw(mean: float) -> int:
        # A log-normal with this mean: mu = ln(mean) - sigma^2 / 2.
        return max(1, round(rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)))

    return lambda: (draw(prompt), draw(output))
