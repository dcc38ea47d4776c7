"""A subscriber written from vLLM's published KV-event format alone (pyzmq and the msgpack package;
nothing of Argosy's): multipart `[topic, 8-byte big-endian sequence number, payload]`, the payload
`[ts, events, data_parallel_rank]`, each event a map with its `type`; and the replay protocol,
`[b"", start]` to a ROUTER socket, answered by `[b"", seq, payload]` messages and `seq = -1` last.
It also hashes blocks as the server documents it (sha256 chained over 8-byte little-endian token ids,
the external hash the digest's last 8 bytes, big-endian)."""

from __future__ import annotations

import hashlib
import struct
import time

import msgpack
import zmq

FIELDS = {
    "BlockStored": {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name"},
    "BlockRemoved": {"type", "block_hashes", "medium"},
    "AllBlocksCleared": {"type"},
}  # fmt: skip


def chain(token_ids: list[int], block_size: int, seed: bytes = b"") -> list[int]:
    """The external hashes of the full blocks of `token_ids`."""
    digests, parent = [], seed
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        block = token_ids[start : start + block_size]
        parent = hashlib.sha256(parent + struct.pack(f"<{len(block)}q", *block)).digest()
        digests.append(int.from_bytes(parent[-8:], "big"))
    return digests


class Subscriber:
    def __init__(self, endpoint: str, topic: bytes = b""):
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        self.socket.connect(endpoint)
        self.messages: list[tuple[bytes, int, list]] = []  # (topic, seq, batch)

    def wait_connected(self, probe) -> None:
        """PUB drops what it sends before a subscription arrives: `probe()` is run (it must make events)
        until one is received."""
        for _ in range(50):
            probe()
            if self.receive(0.2):
                return
        raise AssertionError("no event reached the subscriber")

    def receive(self, seconds: float) -> bool:
        """Takes what has arrived, waiting up to `seconds` for the first message."""
        got = False
        while self.socket.poll(int(seconds * 1000) if not got else 0):
            topic, seq, payload = self.socket.recv_multipart()
            assert len(seq) == 8
            self.messages.append((topic, int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
            got = True
        return got

    def poll_until(self, condition, timeout: float = 30.0, what: str = "the events") -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            self.receive(0.05)

    def drain(self, publisher) -> None:
        """Until every batch `publisher` (in this process) has queued so far has been received."""
        self.poll_until(
            lambda: publisher.pending == 0 and (not self.messages or self.messages[-1][1] >= publisher.published - 1),
            what="the publisher's queued batches",
        )

    def events(self, messages=None) -> list[dict]:
        out = []
        for _, _, batch in self.messages if messages is None else messages:
            assert isinstance(batch, list) and len(batch) == 3
            ts, events, rank = batch
            assert isinstance(ts, float) and abs(time.time() - ts) < 600 and rank == 0
            for event in events:
                assert set(event) == FIELDS[event["type"]], event
                out.append(event)
        return out

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()


def replay(endpoint: str, start: int) -> list[tuple[int, list]]:
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.connect(endpoint)
    try:
        socket.send_multipart([b"", start.to_bytes(8, "big", signed=True)])
        got = []
        while socket.poll(5000):
            empty, seq, payload = socket.recv_multipart()
            assert empty == b""
            number = int.from_bytes(seq, "big", signed=True)
            if number == -1:
                return got
            got.append((number, msgpack.unpackb(payload, raw=False)))
        raise AssertionError("the replay did not end")
    finally:
        socket.close(linger=0)
        context.term()
