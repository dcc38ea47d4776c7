"""AdapterHostCache: which adapters the workers keep in host memory, by digest, decided in the
engine: those requests in flight hold, and at most `max_cpu_loras` others, the least recently used
of which goes first. The workers read an adapter when told to (reading it is where a request whose
adapter's files changed fails, alone) and let it go when told to; a device slot is loaded from
what they hold. Only the adapter's reference and digest cross to them."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from argosy.server.lora.request import AdapterRef


class AdapterReader(Protocol):
    """The workers' side (the executor's add_adapter and remove_adapter)."""

    def add_adapter(self, ref: AdapterRef) -> None: ...

    def remove_adapter(self, digest: str) -> None: ...


class AdapterHostCache:
    def __init__(self, workers: AdapterReader, max_cpu_loras: int):
        self.workers, self.capacity = workers, max_cpu_loras
        self.adapters: OrderedDict[str, str] = OrderedDict()  # digest -> name, least recently used first
        self.holders: dict[str, int] = {}  # requests in flight holding each digest

    def names(self) -> dict[str, str]:
        return dict(self.adapters)

    def load(self, ref: AdapterRef) -> None:
        """The adapter read by the workers unless they hold it; raises AdapterError."""
        if ref.digest not in self.adapters:
            self.workers.add_adapter(ref)
            self.adapters[ref.digest] = ref.name
        self.adapters.move_to_end(ref.digest)
        self._evict()

    def hold(self, ref: AdapterRef) -> None:
        """Loads the adapter and keeps it until the same number of releases."""
        self.holders[ref.digest] = self.holders.get(ref.digest, 0) + 1
        try:
            self.load(ref)
        except Exception:
            self.release(ref.digest)
            raise

    def release(self, digest: str) -> None:
        count = self.holders[digest] - 1
        if count:
            self.holders[digest] = count
        else:
            del self.holders[digest]
            self._evict()

    def drop(self, digest: str) -> None:
        """Forgets an adapter no request holds (unloaded); a held one stays until released."""
        if digest not in self.holders and self.adapters.pop(digest, None) is not None:
            self.workers.remove_adapter(digest)

    def _evict(self) -> None:
        unheld = [d for d in self.adapters if d not in self.holders]
        for digest in unheld[: max(0, len(unheld) - self.capacity)]:
            del self.adapters[digest]
            self.workers.remove_adapter(digest)
