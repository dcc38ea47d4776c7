"""MessageQueue: one writer broadcasting byte messages to a fixed set of readers through shared
memory, a ring of SLOTS chunks. A slot holds one chunk of a message and a header: whether it is
written, one read flag per reader, the chunk's length and whether the message goes on in the next
slot (a message longer than a chunk spans several). The writer takes a slot once every reader has
read it; a reader takes the slots in ring order. Nothing is copied through the kernel and no
process is woken by a system call: both sides poll, yielding at first, then sleeping up to
MAX_NAP_S, so an idle reader costs little CPU and a busy one sees the next plan at once.

Stores are ordered as x86 orders them (the flags are written after the bytes they guard), the
machines the project runs on."""

from __future__ import annotations

import functools
import os
import struct
import time
from collections.abc import Callable
from multiprocessing import shared_memory

SLOTS = 8
CHUNK_BYTES = 256 << 10  # 2 MiB in all: /dev/shm is small in many pods
SPIN_S = 0.0005  # polled with sched_yield this long, then naps
MAX_NAP_S = 0.001
_LENGTH = struct.Struct("<IB")  # the chunk's length, and 1 where the message goes on


class MessageQueue:
    def __init__(
        self, readers: int, name: str | None = None, reader: int | None = None, chunk_bytes: int = CHUNK_BYTES
    ):
        """The writer's (`name` None: the memory is made here) or reader `reader`'s end of the
        queue named `name`."""
        self.readers, self.reader, self.chunk_bytes = readers, reader, chunk_bytes
        self.header = 1 + readers + _LENGTH.size
        self.slot_bytes = self.header + chunk_bytes
        self.owner = name is None
        if self.owner:
            self.memory = shared_memory.SharedMemory(create=True, size=SLOTS * self.slot_bytes)
            self.memory.buf[: SLOTS * self.slot_bytes] = bytes(SLOTS * self.slot_bytes)
        else:
            self.memory = _attach(name)
        self.name = self.memory.name
        self.next = 0  # the slot this end writes or reads next

    def handle(self) -> tuple[int, str, int]:
        """What a reader's end is made from: (readers, name, chunk bytes)."""
        return self.readers, self.name, self.chunk_bytes

    def put(self, message: bytes, alive: Callable[[], None] = lambda: None) -> None:
        """Broadcasts `message`; `alive` is called while a reader is behind and raises if one is gone."""
        view = memoryview(message)
        offset = 0
        while True:
            chunk = view[offset : offset + self.chunk_bytes]
            offset += len(chunk)
            more = offset < len(view)
            base = self.next * self.slot_bytes
            buf = self.memory.buf
            _wait(functools.partial(self._free, base), alive)
            buf[base] = 0
            buf[base + 1 : base + 1 + self.readers] = bytes(self.readers)
            _LENGTH.pack_into(buf, base + 1 + self.readers, len(chunk), more)
            buf[base + self.header : base + self.header + len(chunk)] = chunk
            buf[base] = 1  # written, last: the bytes before it are what readers see
            self.next = (self.next + 1) % SLOTS
            if not more:
                return

    def get(self, alive: Callable[[], None] = lambda: None) -> bytes:
        """The next message, waited for."""
        parts = []
        flag = 1 + self.reader
        while True:
            base = self.next * self.slot_bytes
            buf = self.memory.buf
            _wait(functools.partial(self._unread, base), alive)
            length, more = _LENGTH.unpack_from(buf, base + 1 + self.readers)
            parts.append(bytes(buf[base + self.header : base + self.header + length]))
            buf[base + flag] = 1  # read, last: the writer may reuse the slot once all are
            self.next = (self.next + 1) % SLOTS
            if not more:
                return b"".join(parts)

    def _free(self, base: int) -> bool:
        buf = self.memory.buf
        return buf[base] == 0 or all(buf[base + 1 : base + 1 + self.readers])

    def _unread(self, base: int) -> bool:
        buf = self.memory.buf
        return buf[base] == 1 and buf[base + 1 + self.reader] == 0

    def close(self) -> None:
        """Lets go of the memory (the writer removes it); again, nothing."""
        if self.memory.buf is None:
            return
        self.memory.close()
        if self.owner:
            self.memory.unlink()


def _wait(ready: Callable[[], bool], alive: Callable[[], None]) -> None:
    started = time.monotonic()
    nap = 0.0
    while not ready():
        waited = time.monotonic() - started
        if waited < SPIN_S:
            os.sched_yield()
            continue
        nap = min(MAX_NAP_S, nap * 2 or 0.00005)
        time.sleep(nap)
        if waited > 0.1:
            alive()


def _attach(name: str) -> shared_memory.SharedMemory:
    """The writer's memory, opened without claiming it: the writer removes it. Before Python 3.13
    opening registers it with the resource tracker, which a spawned reader shares with the writer
    (it keeps one entry per name), so the writer's removal is still the one that counts."""
    try:
        return shared_memory.SharedMemory(name=name, track=False)
    except TypeError:  # no `track` before Python 3.13
        return shared_memory.SharedMemory(name=name)
