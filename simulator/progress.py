"""A progress bar over simulated time, updated at most once per simulated second."""

from __future__ import annotations

from tqdm import tqdm


class SimulatedTimeBar:
    def __init__(self, until: float):
        self._bar = tqdm(total=round(until), unit="s", desc="simulated", dynamic_ncols=True)
        self._shown = 0

    def advance(self, now: float) -> None:
        second = min(int(now), self._bar.total)
        if second > self._shown:
            self._bar.update(second - self._shown)
            self._shown = second

    def __enter__(self) -> SimulatedTimeBar:
        return self

    def __exit__(self, *exc) -> None:
        self._bar.close()
