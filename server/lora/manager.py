"""LoRAManager: the engine core's side of the adapters, in requests and digests only. A request
holds its adapter in host memory from the moment it is queued (reading it there is where a
request with a broken adapter fails, alone), and a device slot from its first admission; both
until it ends, however it ends. The step plan carries the slot loads the scheduler's admissions
decided."""

from __future__ import annotations

from typing import TYPE_CHECKING

from argosy.server.lora.host_cache import AdapterHostCache
from argosy.server.lora.request import AdapterRef
from argosy.server.lora.slots import LoRASlots

if TYPE_CHECKING:
    from argosy.server.engine.sequence import Request


class LoRAManager:
    def __init__(self, host: AdapterHostCache, slots: LoRASlots):
        self.host, self.slots = host, slots

    def add(self, request: Request) -> None:
        """A request is queued; raises AdapterError (nothing held) when its adapter cannot be read."""
        if request.lora is not None:
            self.host.hold(request.lora)

    def can_admit(self, request: Request) -> bool:
        return request.lora is None or request.lora_slot is not None or self.slots.can_acquire(request.lora)

    def admit(self, request: Request) -> None:
        if request.lora is not None and request.lora_slot is None:
            request.lora_slot = self.slots.acquire(request.lora)

    def remove(self, request: Request) -> None:
        """A request ended (finished, aborted or failed): what it held goes back."""
        if request.lora is None:
            return
        if request.lora_slot is not None:
            self.slots.release(request.lora_slot)
            request.lora_slot = None
        self.host.release(request.lora.digest)
        if self.slots.is_retired(request.lora.digest):
            self.host.drop(request.lora.digest)

    def load(self, ref: AdapterRef) -> None:
        """An adapter registered while serving: read into host memory now, served again if it
        had been retired."""
        self.slots.unretire(ref.digest)
        self.host.load(ref)

    def retire(self, digest: str) -> None:
        """An adapter unloaded (or replaced): new requests can no longer name it; it leaves host
        memory and its slot once the last request holding it ends."""
        self.slots.retire(digest)
        self.host.drop(digest)

    def loaded(self) -> dict[str, list[str]]:
        """The adapters' names by tier: "device" (in a slot), "host" (in host memory only)."""
        served = [ref for ref in self.slots.refs if ref is not None and not self.slots.is_retired(ref.digest)]
        device = {ref.digest: ref.name for ref in served}
        host = [name for d, name in self.host.names().items() if d not in device and not self.slots.is_retired(d)]
        return {"device": sorted(device.values()), "host": sorted(host)}
