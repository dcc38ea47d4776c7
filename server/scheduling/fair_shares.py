"""FairShares: the tokens each user has been served, for the fair policy. A user's count is what
orders its requests against the others'; a user coming back after being idle starts level with
the least-served active user, so that idle time is never banked as credit."""

from __future__ import annotations

from argosy.server.engine.sequence import Sequence
from argosy.server.scheduling.policy import OUTPUT_WEIGHT


class FairShares:
    def __init__(self) -> None:
        self._served: dict[str, float] = {}
        self._active: dict[str, set[int]] = {}  # each user's sequences in flight (waiting or running)

    def served(self, user: str | None) -> float:
        return self._served.get(user or "", 0.0)

    def arrive(self, user: str | None, seq: Sequence) -> None:
        user = user or ""
        if not self._active.get(user):
            floor = min((self._served[u] for u, seqs in self._active.items() if seqs), default=0.0)
            self._served[user] = max(self._served.get(user, 0.0), floor)
        self._active.setdefault(user, set()).add(seq.seq_id)

    def leave(self, user: str | None, seq: Sequence) -> None:
        self._active.get(user or "", set()).discard(seq.seq_id)

    def charge(self, user: str | None, prompt_tokens: int, output_tokens: int) -> None:
        user = user or ""
        self._served[user] = self._served.get(user, 0.0) + prompt_tokens + OUTPUT_WEIGHT * output_tokens
