"""ProgressWatchdog: when the engine core owes the API process a message, and for how long.

The core owes one while it holds work (each step ends with a message), once it is pinged (its
loop answers with one), and while it runs a control command (a weight update, a wake-up: they
read checkpoints and capture graphs, so they get a limit of their own, CONTROL_TIMEOUT). A core
that owes a message for longer than its limit is hung: a stuck device call, a collective that
never returns, a deadlock, a stopped process. While it owes nothing, silence past the ping
interval earns a ping, so an idle core is checked too.

Decisions only, on times the caller passes (time.monotonic()): the engine client feeds it what
it sends and receives and acts on what `poll` says."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_PING_INTERVAL = 5.0  # seconds of silence from an idle core before it is pinged
CONTROL_TIMEOUT = 3600.0  # seconds a control command may take: a large checkpoint from a slow disk
PING = "ping"


@dataclass(frozen=True)
class Hang:
    """The core has owed a message for `seconds`: a step's end, or a ping's answer."""

    waiting_for: Literal["step", "ping", "control"]
    seconds: float


class ProgressWatchdog:
    def __init__(self, timeout: float, now: float):
        self.timeout = timeout
        self.ping_interval = min(MAX_PING_INTERVAL, timeout / 4)
        self.tick = min(1.0, timeout / 10)  # how often the caller polls
        self._last_heard = now
        self._owed_since: float | None = None  # when the oldest unanswered obligation began
        self._waiting_for: Literal["step", "ping", "control"] = "step"
        self.hang: Hang | None = None  # once declared, it stands

    def sent_work(self, now: float) -> None:
        """A request went to the core: it owes a step from now, unless it owed something already."""
        if self._owed_since is None:
            self._owed_since, self._waiting_for = now, "step"

    def sent_control(self, now: float) -> None:
        """A control command went to the core: it owes its answer within CONTROL_TIMEOUT."""
        self._owed_since, self._waiting_for = now, "control"

    def heard(self, now: float, holds_work: bool) -> None:
        """A message came; the core owes the next step's from now if it still holds work."""
        self._last_heard = now
        self._owed_since = now if holds_work else None
        self._waiting_for = "step"

    def poll(self, now: float, unread: bool = False) -> Hang | str | None:
        """PING when the caller should ping the core now, a Hang once it is hung, else None.
        `unread`: a message has arrived that the caller has not handled yet (its event loop was
        held up), which may be the one owed: no verdict until it is read."""
        if self.hang is not None:
            return self.hang
        if self._owed_since is None:
            if now - self._last_heard < self.ping_interval:
                return None
            self._owed_since, self._waiting_for = now, "ping"
            return PING
        stalled = now - self._owed_since
        limit = max(self.timeout, CONTROL_TIMEOUT) if self._waiting_for == "control" else self.timeout
        if stalled <= limit or unread:
            return None
        self.hang = Hang(self._waiting_for, stalled)
        return self.hang

    def stalled_seconds(self, now: float) -> float:
        """How long the core has owed a message (0 when it owes none); frozen once it hung."""
        if self.hang is not None:
            return self.hang.seconds
        return 0.0 if self._owed_since is None else now - self._owed_since
