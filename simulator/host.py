"""SharedHost: replicas that share one machine's cores rather than each owning a device, as a
loopback fleet of CPU replicas does. A step that starts while k replicas (itself included) are in
a step runs max(1, k x threads / cores) times its profiled time: the cores are shared evenly,
and the share is fixed when the step starts (steps are short beside the changes in k)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SharedHost:
    cores: int
    threads_per_replica: int = 1
    busy: int = 0  # replicas in a step now

    def slowdown(self) -> float:
        return max(1.0, self.busy * self.threads_per_replica / self.cores)
