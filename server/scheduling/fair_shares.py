"""FairShares: the tokens each user has been served, for the fair policy. A user's count is what
orders its requests against the others'; a user coming back after being idle starts level with
the least-served active user, so that idle time is never banked as credit.

What it holds is bounded: users with work in flight (bounded by the waiting queue and the
running batch), and the counts of at most MAX_IDLE_USERS idle ones, the longest idle forgotten
first. A forgotten user who comes back starts level with the least-served active user, as every
newcomer does: it can only lose the lead it had, never gain credit."""

from __future__ import annotations

from collections import OrderedDict

from argosy.server.engine.sequence import Sequence
from argosy.server.scheduling.policy import MAX_IDLE_USERS, OUTPUT_WEIGHT


class FairShares:
    def __init__(self, max_idle_users: int = MAX_IDLE_USERS) -> None:
        self.max_idle_users = max_idle_users
        self._served: dict[str, float] = {}  # users with work in flight
        self._active: dict[str, set[int]] = {}  # their sequences in flight (waiting or running)
        self._idle: OrderedDict[str, float] = OrderedDict()  # idle users' counts, the longest idle first

    def served(self, user: str | None) -> float:
        user = user or ""
        return self._served.get(user, self._idle.get(user, 0.0))

    @property
    def num_users(self) -> int:
        """Users remembered: with work in flight, or idle and not yet forgotten."""
        return len(self._served) + len(self._idle)

    def arrive(self, user: str | None, seq: Sequence) -> None:
        user = user or ""
        if user not in self._active:
            floor = min(self._served.values(), default=0.0)
            self._served[user] = max(self._idle.pop(user, 0.0), floor)
            self._active[user] = set()
        self._active[user].add(seq.seq_id)

    def leave(self, user: str | None, seq: Sequence) -> None:
        user = user or ""
        seqs = self._active.get(user)
        if seqs is None:
            return
        seqs.discard(seq.seq_id)
        if not seqs:
            del self._active[user]
            self._idle[user] = self._served.pop(user)
            while len(self._idle) > self.max_idle_users:
                self._idle.popitem(last=False)

    def charge(self, user: str | None, prompt_tokens: int, output_tokens: int) -> None:
        user = user or ""
        if user in self._served:  # only sequences in flight are scheduled
            self._served[user] += prompt_tokens + OUTPUT_WEIGHT * output_tokens
