"""SharedHost: replicas that share one machine's cores rather than each owning a device, as a
loopback fleet of CPU replicas does. The cores are shared as the operating system shares them
among busy processes (processor sharing): while k replicas are in a step, each step advances at
min(1, cores / (k x threads)) of its profiled speed, and the rate changes the moment a step starts
or ends anywhere on the host, since the steps (tenths of a second on a CPU) are as long as the
gaps between them."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

DONE_EPSILON = 1e-9  # seconds of work left that count as none (floating-point remainders)


@dataclass
class _Step:
    work: float  # profiled seconds still to run
    done: simpy.Event


class SharedHost:
    def __init__(self, env: simpy.Environment, cores: int, threads_per_replica: int = 1):
        self.env = env
        self.cores = cores
        self.threads_per_replica = threads_per_replica
        self._steps: list[_Step] = []
        self._since = env.now  # when the steps' work was last brought up to date
        self._changed = env.event()
        env.process(self._run())

    def run(self, seconds: float) -> simpy.Event:
        """A step of `seconds` profiled time: the event fires when it is done."""
        self._advance()
        step = _Step(seconds, self.env.event())
        self._steps.append(step)
        self._changed.succeed()
        self._changed = self.env.event()
        return step.done

    def _rate(self) -> float:
        return min(1.0, self.cores / (len(self._steps) * self.threads_per_replica)) if self._steps else 1.0

    def _advance(self) -> None:
        elapsed, rate = self.env.now - self._since, self._rate()
        for step in self._steps:
            step.work -= elapsed * rate
        self._since = self.env.now

    def _run(self):
        while True:
            if not self._steps:
                yield self._changed
                continue
            soonest = min(step.work for step in self._steps) / self._rate()
            yield self._changed | self.env.timeout(max(0.0, soonest))
            self._advance()
            for step in [s for s in self._steps if s.work <= DONE_EPSILON]:
                self._steps.remove(step)
                step.done.succeed()
