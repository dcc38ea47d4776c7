"""Waiting for a condition, never for a time: one rule for every test. A check is polled until
it returns something truthy, which is returned; until then an AssertionError, KeyError or
TypeError (the object is not there yet) or a refused connection (the server is not up yet)
counts as "not yet". Past the timeout the test fails, naming what it waited for."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx

INTERVAL = 0.05
NOT_YET = (AssertionError, KeyError, TypeError, httpx.TransportError)


class _Poll:
    def __init__(self, check: Callable[[], Any], timeout: float, what: str):
        self.check, self.what = check, what
        self.deadline = time.monotonic() + timeout
        self.last_error: Exception | None = None

    def attempt(self) -> Any:
        try:
            return self.check()
        except NOT_YET as exc:
            self.last_error = exc
            return None

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def failure(self) -> AssertionError:
        error = AssertionError(f"timed out waiting for {self.what}")
        error.__cause__ = self.last_error
        return error


def wait_until(check: Callable[[], Any], timeout: float = 20.0, what: str = "the condition") -> Any:
    poll = _Poll(check, timeout, what)
    while not (result := poll.attempt()):
        if poll.expired():
            raise poll.failure()
        time.sleep(INTERVAL)
    return result


async def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "the condition") -> Any:
    """wait_until for tests running in an event loop: the loop keeps running meanwhile."""
    poll = _Poll(check, timeout, what)
    while not (result := poll.attempt()):
        if poll.expired():
            raise poll.failure()
        await asyncio.sleep(INTERVAL)
    return result
