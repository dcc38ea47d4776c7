"""ResponseStore: the responses kept for `GET /v1/responses/{id}` and `previous_response_id`,
each with the conversation that continues from it. Bounded three ways (entries, bytes and age:
the oldest goes first), and each entry is its owner's: the bearer key that created it, so one
key never reads, continues or deletes another's (an id of another key is simply not found)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class StoredResponse:
    owner: str
    response: dict  # the Response object, as it was answered
    conversation: list[dict]  # the chat messages up to and including its output, without instructions
    created: float  # on the store's clock
    size: int  # bytes of both, as JSON


def owner_of(authorization: str | None) -> str:
    """Who owns what a request stores: a digest of its bearer key (none: the anonymous owner)."""
    return hashlib.sha256((authorization or "").encode()).hexdigest()[:32]


class ResponseStore:
    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        ttl_s: float,
        registry: CollectorRegistry,
        model_name: str,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.max_entries, self.max_bytes, self.ttl_s, self.clock = max_entries, max_bytes, ttl_s, clock
        self.entries: OrderedDict[str, StoredResponse] = OrderedDict()  # oldest first
        self.bytes = 0
        labels = {"model_name": model_name}
        entries = Gauge("argosy_responses_stored", "Responses in the store", list(labels), registry=registry)
        entries.labels(**labels).set_function(lambda: len(self.entries))
        stored_bytes = Gauge(
            "argosy_responses_stored_bytes", "Bytes of the stored responses and conversations", list(labels),
            registry=registry,
        )  # fmt: skip
        stored_bytes.labels(**labels).set_function(lambda: self.bytes)
        lookups = Counter(
            "argosy_responses_store_lookups",
            "Stored responses looked up (GET, DELETE, previous_response_id), by result: hit or miss",
            [*labels, "result"],
            registry=registry,
        )
        self.hits, self.misses = lookups.labels(**labels, result="hit"), lookups.labels(**labels, result="miss")

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def put(self, owner: str, response: dict, conversation: list[dict]) -> None:
        size = len(json.dumps(response)) + len(json.dumps(conversation))
        if not self.enabled or size > self.max_bytes:
            return
        entry = StoredResponse(owner, response, conversation, self.clock(), size)
        self._drop(response["id"])
        self.entries[response["id"]] = entry
        self.bytes += size
        self._expire()
        while len(self.entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self.entries)))

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        self._expire()
        entry = self.entries.get(response_id)
        found = entry if entry is not None and entry.owner == owner else None
        (self.hits if found is not None else self.misses).inc()
        return found

    def delete(self, owner: str, response_id: str) -> bool:
        if self.get(owner, response_id) is None:
            return False
        self._drop(response_id)
        return True

    def _expire(self) -> None:
        oldest = self.clock() - self.ttl_s
        while self.entries and next(iter(self.entries.values())).created < oldest:
            self._drop(next(iter(self.entries)))

    def _drop(self, response_id: str) -> None:
        entry = self.entries.pop(response_id, None)
        if entry is not None:
            self.bytes -= entry.size
