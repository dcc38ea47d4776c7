"""CompileQueue: which grammar compiles run, in what order, for whom. Each compile belongs to the
client that first asked for it (its `user`, else its address; None in the offline engine, whose
one caller is bounded by nothing but `max_running`); the clients take turns, each client's
compiles by arrival. At most `max_running` compiles run at once, at most `per_client_running` of
one client's, and a client may have at most `per_client_pending` queued or running: one client's
heavy grammars cannot hold every compile, nor queue without end. Pure bookkeeping: the
GrammarCompiler starts and stops the processes it names."""

from __future__ import annotations

from collections import OrderedDict, deque

from argosy.server.exceptions import TooManyRequestsError


class CompileQueue:
    def __init__(self, max_running: int, per_client_running: int, per_client_pending: int):
        self.max_running, self.per_client_running = max_running, per_client_running
        self.per_client_pending = per_client_pending
        self.queued: OrderedDict[str | None, deque[str]] = OrderedDict()  # client -> keys; the next to serve first
        self.running: dict[str, str | None] = {}  # key -> client
        self.owner: dict[str, str | None] = {}  # key -> client, queued or running

    def pending(self, client: str | None) -> int:
        return sum(1 for owner in self.owner.values() if owner == client)

    def add(self, key: str, client: str | None, field: str) -> None:
        """Queues the compile of `key` for `client`; raises TooManyRequestsError (naming `field`)
        when the client already has its share pending."""
        if client is not None and self.pending(client) >= self.per_client_pending:
            raise TooManyRequestsError(
                f"{field}: {self.per_client_pending} grammars of this client are compiling already; retry later",
                param=field,
            )
        self.queued.setdefault(client, deque()).append(key)
        self.owner[key] = client

    def remove(self, key: str) -> bool:
        """Withdraws `key`, queued or running; True if it was running (its process must stop)."""
        if key not in self.owner:
            return False
        client = self.owner.pop(key)
        if key in self.running:
            del self.running[key]
            return True
        keys = self.queued[client]
        keys.remove(key)
        if not keys:
            del self.queued[client]
        return False

    def is_running(self, key: str) -> bool:
        return key in self.running

    def start(self) -> list[str]:
        """The keys to start now, taken from the queue into the running set: the clients in turn,
        one compile each per turn, while there is room."""
        started = []
        while len(self.running) < self.max_running:
            turn = [c for c in self.queued if self._room(c)][:1]  # the longest unserved client with room
            if not turn:
                break
            client = turn[0]
            keys = self.queued.pop(client)
            key = keys.popleft()
            if keys:
                self.queued[client] = keys  # to the back of the line
            self.running[key] = client
            started.append(key)
        return started

    def _room(self, client: str | None) -> bool:
        return client is None or sum(1 for owner in self.running.values() if owner == client) < self.per_client_running
