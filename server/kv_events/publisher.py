"""ZmqEventPublisher: sends each step's event batch on a ZMQ PUB socket from a thread of its own,
bound where the endpoint has a wildcard (`tcp://*:5557`, `tcp://127.0.0.1:*`) or is ipc/inproc, and
otherwise connected to it (a subscriber that binds, as llm-d's Endpoint Picker does), as vLLM decides,
so that a step never waits for a subscriber. The step hands a batch to a bounded queue; a full
queue drops the batch and counts it (a subscriber that falls too far behind loses events, never
the engine its speed). The PUB socket's high-water mark bounds what it buffers for a slow
subscriber in the same way. With a replay endpoint, a ROUTER socket answers
`[identity, b"", start sequence number]` with every buffered batch from that number on, as
`[identity, b"", number, payload]`, then `[identity, b"", -1, b""]`."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque

import msgspec
import zmq

from argosy.server.exceptions import EndpointInUseError
from argosy.server.kv_events.config import KVEventsConfig
from argosy.server.kv_events.wire import END_OF_REPLAY, EventBatch, sequence_bytes

log = logging.getLogger("argosy.kv_events")
POLL_MS = 100  # how often the thread looks for replay requests while no batch comes


def binds(endpoint: str) -> bool:
    """Whether the PUB socket binds the endpoint (else it connects to a subscriber that does)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    def __init__(self, config: KVEventsConfig):
        self.config = config
        self.dropped = 0  # batches the full queue turned away
        self.published = 0
        self._queue: queue.Queue[EventBatch | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._context = zmq.Context()
        # Bound here, in the caller's thread, so that an endpoint already in use fails the start.
        self._sockets: list[zmq.Socket] = []
        try:
            self._pub = self._bind(zmq.PUB, config.endpoint, "endpoint", connect=not binds(config.endpoint))
            self._replay = None
            if config.replay_endpoint is not None:
                self._replay = self._bind(zmq.ROUTER, config.replay_endpoint, "replay_endpoint")
        except EndpointInUseError:
            self._close_sockets()
            raise
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def _bind(self, kind: int, endpoint: str, name: str, connect: bool = False) -> zmq.Socket:
        socket = self._context.socket(kind)
        self._sockets.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        if kind == zmq.PUB:
            socket.set_hwm(self.config.hwm)
        try:
            if connect:
                socket.connect(endpoint)
            else:
                socket.bind(endpoint)
        except zmq.ZMQError as exc:
            raise EndpointInUseError(f"kv_events_config.{name} {endpoint} cannot be bound: {exc}") from exc
        return socket

    def _close_sockets(self) -> None:
        for socket in self._sockets:
            socket.close(linger=0)
        self._context.term()

    @property
    def bound_endpoints(self) -> tuple[str, str | None]:
        """The endpoints as bound (a tcp port 0 or wildcard resolved), for tests and the log."""
        replay = None if self._replay is None else self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        return self._pub.getsockopt_string(zmq.LAST_ENDPOINT), replay

    @property
    def pending(self) -> int:
        """Batches queued and not yet sent."""
        return self._queue.unfinished_tasks

    def publish(self, batch: EventBatch) -> None:
        """Never blocks: a batch that finds the queue full is dropped and counted."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Sends what is queued, then stops the thread and closes the sockets."""
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        encoder, topic = msgspec.msgpack.Encoder(), self.config.topic.encode()
        numbers = itertools.count()
        try:
            while True:
                self._serve_replays()
                try:
                    batch = self._queue.get(timeout=POLL_MS / 1000)
                except queue.Empty:
                    continue
                if batch is None:
                    return
                seq, payload = next(numbers), encoder.encode(batch)
                self._pub.send_multipart((topic, sequence_bytes(seq), payload), copy=False)
                self._buffer.append((seq, payload))
                self.published += 1
                self._queue.task_done()
        except Exception:
            log.exception("the KV event publisher stopped")
        finally:
            self._close_sockets()

    def _serve_replays(self) -> None:
        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("a malformed replay request (%d frames) was ignored", len(frames))
                continue
            identity, start = frames[0], int.from_bytes(frames[2], "big", signed=True)
            kept = list(self._buffer)
            if kept and start < kept[0][0]:
                log.warning("replay from %d asked; batches before %d are no longer kept", start, kept[0][0])
            for seq, payload in kept:
                if seq >= start:
                    self._replay.send_multipart((identity, b"", sequence_bytes(seq), payload))
            self._replay.send_multipart((identity, b"", END_OF_REPLAY, b""))
