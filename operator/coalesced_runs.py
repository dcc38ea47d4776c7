"""Reconciles of one object, coalesced. kopf calls a handler per event, in a small thread pool:
a rollout that changes an owner's Deployment, Service, PodDisruptionBudget and pods at once
asks for one reconcile per change, and had each waited for the one before it (they must never
overlap), every thread of the pool could sit waiting on one object while another object's
changes waited for a thread. A run reads the object afresh, so it serves every request made
before it began: a request made while a run is going folds into one more run after it, and the
caller who needs no answer (an event) returns at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Runs:
    requested: int = 0  # requests made so far
    covered: int = 0  # requests served by a finished run
    running: bool = False
    result: Any = None  # the latest finished run's
    error: BaseException | None = None


class CoalescedRuns:
    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._runs: dict[Hashable, _Runs] = {}

    def request(self, key: Hashable, run: Callable[[], Any], wait: bool) -> Any:
        """Runs `run` for `key` unless a run is going, which then runs once more when it ends.
        With `wait`, returns the result of the first run begun after this request (raising what
        it raised); without, None at once when another thread runs it."""
        with self._changed:
            runs = self._runs.setdefault(key, _Runs())
            runs.requested += 1
            mine = runs.requested
            if runs.running:
                if not wait:
                    return None
                self._changed.wait_for(lambda: runs.covered >= mine)
                if runs.error is not None:
                    raise runs.error
                return runs.result
            runs.running = True
        return self._drain(key, runs, run)

    def idle(self, key: Hashable) -> bool:
        with self._changed:
            runs = self._runs.get(key)
            return runs is None or not runs.running

    def _drain(self, key: Hashable, runs: _Runs, run: Callable[[], Any]) -> Any:
        while True:
            with self._changed:
                serving = runs.requested
            try:
                result, error = run(), None
            except BaseException as exc:
                result, error = None, exc
            with self._changed:
                # A failed run answers every request so far with its error: the next event or
                # kopf's retry asks again.
                runs.covered = runs.requested if error is not None else serving
                runs.result, runs.error = result, error
                self._changed.notify_all()
                if runs.covered == runs.requested:
                    runs.running = False
                    del self._runs[key]
                    if error is not None:
                        raise error
                    return result
