"""What one pass does for one ModelCache on the node, decided from what it knows: the manifest,
the copy held, the attempt under way or failed, the copies under way and the quota. Attempt is
that knowledge between passes; decide is a function of it."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from argosy.operator.model_cache.agent.copier import Progress
from argosy.operator.model_cache.agent.manifest import Manifest
from argosy.operator.model_cache.agent.quota import HeldCopy, make_room
from argosy.operator.model_cache.agent.sources import FetchError
from argosy.operator.model_cache.agent.store import StoredCopy

HALT_SECONDS = 30.0


@dataclass
class Attempt:
    """One ModelCache's copy on this node, across passes, for one spec generation."""

    generation: int
    manifest: Manifest | None = None
    count: int = 0  # attempts started
    progress: Progress | None = None
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    error: FetchError | None = None  # why the last attempt (or reading the manifest) failed
    retry_at: float = 0.0  # monotonic time before which nothing is tried again
    copied: bool = False  # the last attempt copied and verified every file: the staged copy awaits its move

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def begin(self) -> None:
        self.count += 1
        self.error, self.copied, self.stop = None, False, threading.Event()
        self.progress = Progress(self.manifest.total)

    def failed(self, error: FetchError, config) -> None:
        """Waits before the next try: the delay doubles with each failed attempt, up to a bound."""
        self.error = error
        delay = min(config.retry_max_seconds, config.retry_base_seconds * 2 ** max(0, self.count - 1))
        self.retry_at = time.monotonic() + delay

    def halt(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(HALT_SECONDS)


@dataclass(frozen=True)
class Decision:
    phase: str
    reason: str | None = None
    message: str | None = None
    start: bool = False  # start an attempt
    finish: bool = False  # move the staged copy into place
    evict: tuple[str, ...] = ()  # copies to evict first, in order


def decide(
    key: str, attempt: Attempt, pinned: bool, held: dict[str, StoredCopy], others: list[HeldCopy],
    in_use: set[str], running: int, config, now: float,
) -> Decision:  # fmt: skip
    """`held`: the node's copies by key; `others`: every copy and copy under way but this one's,
    as the quota sees them; `running`: attempts under way on the node."""
    manifest, copy = attempt.manifest, held.get(key)
    if manifest is None:
        error = attempt.error or FetchError("ManifestUnavailable", "the manifest has not been read yet")
        if copy is not None:  # keep serving what is held
            return Decision("Ready", error.reason, f"{error.message}; the copy held is of the last manifest read")
        return Decision("Failed", error.reason, _retrying(error.message, attempt, now))
    if copy is not None and copy.digest == manifest.digest:
        return Decision("Ready")
    if attempt.running:
        return Decision(attempt.progress.phase)
    if attempt.copied:
        if copy is not None and key in in_use:
            message = "the new copy is staged and verified; it replaces the one in use once no pod on the node uses it"
            return Decision("Pending", "InUse", message)
        return Decision("Ready", finish=True)
    if attempt.error is not None and now < attempt.retry_at:
        return Decision("Failed", attempt.error.reason, _retrying(attempt.error.message, attempt, now))
    if running >= config.parallel_copies:
        return Decision("Pending", "Queued", f"{running} copies are under way on the node; this one is next")
    room = make_room(others, manifest.total, pinned, config.quota_bytes)
    if not room.fits:
        return Decision("Pending", "QuotaExceeded", room.message)
    return Decision("Copying", start=True, evict=tuple(room.evict))


def quota_view(
    key: str, held: dict[str, StoredCopy], wanted: dict[str, bool], in_use: set[str], attempts: dict[str, Attempt]
) -> list[HeldCopy]:
    """Every copy but `key`'s as the quota sees it (`wanted`: pinned by key, for the ModelCaches
    that select the node), and a reservation for each copy under way; `key`'s own copy, while
    a new one is made, is held and kept."""
    view = [
        HeldCopy(k, c.size, c.last_used, k in wanted, wanted.get(k, False), k in in_use, busy=k == key)
        for k, c in held.items()
    ]
    view += [  # a copy that has finished but not yet moved into place holds its room too
        HeldCopy(f"{k} (copying)", a.manifest.total, time.time(), True, busy=True)
        for k, a in attempts.items()
        if k != key and (a.running or a.copied)
    ]
    return view


def _retrying(message: str, attempt: Attempt, now: float) -> str:
    wait = max(0, math.ceil(attempt.retry_at - now))
    return f"{message}; attempt {max(1, attempt.count)} failed, next in {wait} s"
