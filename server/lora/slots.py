"""LoRASlots: which adapter each of the `max_loras` device slots holds, and who needs it. A
request takes a slot when it is first admitted and keeps it, preempted or not, until it ends:
a slot some request holds is never given to another adapter, so no sequence can ever run with
another adapter's weights. A request whose adapter is in no slot gets an idle one (an empty one
first, else the least recently used) and the plan carries the load; with every slot held, it
waits. Adapters retired (unloaded, or replaced in place) leave their slot as soon as it idles."""

from __future__ import annotations

import itertools

from argosy.server.lora.request import AdapterRef


class LoRASlots:
    def __init__(self, max_loras: int):
        self.refs: list[AdapterRef | None] = [None] * max_loras  # what each slot holds
        self.holders = [0] * max_loras  # requests holding each slot
        self._last_used = [0] * max_loras
        self._clock = itertools.count(1)
        self._loads: list[tuple[int, AdapterRef]] = []  # decided since the last take
        self._retired: set[str] = set()  # digests to drop once idle

    def slot_of(self, ref: AdapterRef) -> int | None:
        return next((i for i, held in enumerate(self.refs) if held is not None and held.digest == ref.digest), None)

    def can_acquire(self, ref: AdapterRef) -> bool:
        return self.slot_of(ref) is not None or self._idle_slot() is not None

    def acquire(self, ref: AdapterRef) -> int:
        """The slot `ref` runs in from now on, held once more; can_acquire must be true."""
        slot = self.slot_of(ref)
        if slot is None:
            slot = self._idle_slot()
            if slot is None:
                raise RuntimeError(f"no idle LoRA slot for adapter {ref.name!r}")
            self.refs[slot] = ref
            self._loads.append((slot, ref))
        self.holders[slot] += 1
        self._last_used[slot] = next(self._clock)
        return slot

    def release(self, slot: int) -> None:
        self.holders[slot] -= 1
        if self.holders[slot] < 0:
            raise RuntimeError(f"LoRA slot {slot} released more often than acquired")
        ref = self.refs[slot]
        if self.holders[slot] == 0 and ref is not None and ref.digest in self._retired:
            self.refs[slot] = None

    def retire(self, digest: str) -> None:
        """The adapter with these weights is no longer served: its slot empties once idle."""
        self._retired.add(digest)
        for slot, ref in enumerate(self.refs):
            if ref is not None and ref.digest == digest and self.holders[slot] == 0:
                self.refs[slot] = None

    def is_retired(self, digest: str) -> bool:
        return digest in self._retired

    def unretire(self, digest: str) -> None:
        """Served again (loaded anew with the same weights)."""
        self._retired.discard(digest)

    def forget(self, slots: list[int]) -> None:
        """Slots whose load was in a step that failed: what they hold is unknown, so they hold
        nothing (their requests failed with the step)."""
        for slot in slots:
            self.refs[slot] = None

    def take_loads(self) -> list[tuple[int, AdapterRef]]:
        loads, self._loads = self._loads, []
        return loads

    def _idle_slot(self) -> int | None:
        idle = [i for i, n in enumerate(self.holders) if n == 0]
        empty = [i for i in idle if self.refs[i] is None]
        if empty:
            return empty[0]
        return min(idle, key=lambda i: self._last_used[i], default=None)
