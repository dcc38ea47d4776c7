"""AdapterHostCache: adapters read into host memory, by digest: those requests in flight hold,
and at most `max_cpu_loras` others, the least recently used of which goes first. A device
slot is loaded from here. An adapter whose files no longer hold the weights it was registered
with is refused: a request never runs on weights other than those its name stood for."""

from __future__ import annotations

from collections import OrderedDict

import torch

from argosy.server.lora.adapter_folder import AdapterError
from argosy.server.lora.peft_adapter import LoRAAdapter, read_adapter
from argosy.server.lora.request import AdapterRef
from argosy.server.models.model_config import ModelConfig


class AdapterHostCache:
    def __init__(self, model: ModelConfig, max_rank: int, dtype: torch.dtype, max_cpu_loras: int):
        self.model, self.max_rank, self.dtype = model, max_rank, dtype
        self.capacity = max_cpu_loras
        self.adapters: OrderedDict[str, LoRAAdapter] = OrderedDict()  # by digest, least recently used first
        self.holders: dict[str, int] = {}  # requests in flight holding each digest

    def __getitem__(self, digest: str) -> LoRAAdapter:
        return self.adapters[digest]

    def names(self) -> dict[str, str]:
        return {digest: adapter.name for digest, adapter in self.adapters.items()}

    def load(self, ref: AdapterRef) -> LoRAAdapter:
        """The adapter, read from its folder unless here already; raises AdapterError."""
        adapter = self.adapters.get(ref.digest)
        if adapter is None:
            adapter = read_adapter(ref.name, ref.path, self.model, self.max_rank, self.dtype)
            if adapter.digest != ref.digest:
                raise AdapterError(
                    ref.path, f"the weights changed since adapter {ref.name!r} was loaded; load it again to serve them"
                )
            self.adapters[ref.digest] = adapter
        self.adapters.move_to_end(ref.digest)
        self._evict()
        return adapter

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
        if digest not in self.holders:
            self.adapters.pop(digest, None)

    def _evict(self) -> None:
        unheld = [d for d in self.adapters if d not in self.holders]
        for digest in unheld[: max(0, len(unheld) - self.capacity)]:
            del self.adapters[digest]
