"""The shared-memory queue: every reader gets every message, whole and in order, however long
(spanning several slots) and however many (round the ring many times); a writer ahead of a
reader by the whole ring waits for it, and learns, through its check, that a reader is gone."""

from __future__ import annotations

import random
import threading

import pytest

from argosy.server.executor.message_queue import SLOTS, MessageQueue


def test_every_reader_gets_every_message_whole_and_in_order():
    writer = MessageQueue(2, chunk_bytes=64)
    readers = [MessageQueue(*writer.handle()[:2], reader=r, chunk_bytes=64) for r in range(2)]
    rng = random.Random(0)
    messages = [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 63, 64, 65, 300]))) for _ in range(200)]
    got = [[], []]

    def read(r: int) -> None:
        for _ in messages:
            got[r].append(readers[r].get())

    threads = [threading.Thread(target=read, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for message in messages:
        writer.put(message)
    for t in threads:
        t.join(30)
    assert got == [messages, messages]
    for end in (*readers, writer):
        end.close()


def test_a_writer_a_ring_ahead_waits_and_is_told_when_a_reader_is_gone():
    writer = MessageQueue(1, chunk_bytes=16)
    reader = MessageQueue(1, writer.name, reader=0, chunk_bytes=16)
    for i in range(SLOTS):
        writer.put(bytes([i]))
    checks = []

    def gone() -> None:
        checks.append(1)
        raise RuntimeError("the reader is gone")

    with pytest.raises(RuntimeError, match="the reader is gone"):
        writer.put(b"one too many", gone)  # the ring is full: it waits, checking
    assert checks
    assert reader.get() == bytes([0])
    writer.put(b"now it fits")
    assert [reader.get() for _ in range(SLOTS)] == [bytes([i]) for i in range(1, SLOTS)] + [b"now it fits"]
    reader.close()
    writer.close()
    writer.close()  # again: nothing
