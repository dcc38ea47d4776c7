"""SideChannel: the prefill side's end of a hand-off, a thread serving pulls on a ZMQ ROUTER
socket. It serves the blocks a pull names when the pull carries the engine's token for exactly
those blocks of that request (hold_token.py), before the hold ends, once, and only to a puller
whose KV layout is its own; anything else is refused in words, so a forged or stale pull never
reads another request's blocks. A hold the engine ends early (its pull reported, or its request
gone) is revoked here under the same lock the copies are made under, before any step can reuse
its blocks."""

from __future__ import annotations

import logging
import os
import threading
import time

import torch
import zmq

from argosy.server.kv_transfer.hold_token import verify
from argosy.server.kv_transfer.wire import KVLayout, PullReply, PullRequest, decode_request, encode

log = logging.getLogger("argosy.kv_transfer")
POLL_MS = 100


class SideChannel:
    def __init__(self, engine_id: str, layout: KVLayout, host: str, port: int):
        self.engine_id, self.layout = engine_id, layout
        self.secret = os.urandom(32)  # the engine signs holds with it
        self.kv_cache: torch.Tensor | None = None  # set by the worker half before any hold
        self._ended: dict[str, float] = {}  # request id -> its hold's deadline: pulled or revoked
        self._sent: list[str] = []  # requests whose blocks were pulled, since the last report
        self._lock = threading.Lock()
        self.blocks_sent = self.bytes_sent = 0
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        bound = self._socket.bind_to_random_port(f"tcp://{host}") if port == 0 else None
        if bound is None:
            self._socket.bind(f"tcp://{host}:{port}")
        self.host, self.port = host, bound or port
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-side-channel", daemon=True)
        self._thread.start()

    def revoke(self, holds: list[tuple[str, float]]) -> None:
        """(request id, deadline) of holds the engine ended: no pull reads them from now on."""
        now = time.monotonic()
        with self._lock:
            self._ended = {r: d for r, d in self._ended.items() if d > now}  # past their deadline anyway
            self._ended.update(holds)

    def take_sent(self) -> list[str]:
        with self._lock:
            sent, self._sent = self._sent, []
        return sent

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            while not self._stopped.is_set():
                if self._socket.poll(POLL_MS):
                    identity, *frames = self._socket.recv_multipart()
                    self._socket.send_multipart([identity, *self._answer(frames)], copy=False)
        except Exception:
            log.exception("the KV side channel stopped")
        finally:
            self._socket.close(linger=0)
            self._context.term()

    def _answer(self, frames: list[bytes]) -> list:
        try:
            pull = decode_request(frames[-1])
        except Exception as exc:
            return [encode(PullReply(f"a malformed pull: {exc}"))]
        if why := self._refusal(pull):
            return [encode(PullReply(why))]
        blocks = torch.tensor(pull.block_ids, dtype=torch.long, device=self.kv_cache.device)
        with self._lock:
            if pull.request_id in self._ended:
                return [encode(PullReply(f"the blocks of request {pull.request_id!r} were pulled or let go"))]
            # In the cache's own order, the blocks third: one gather, no transposing copy. None: a release.
            payload = self.kv_cache.index_select(2, blocks).cpu()
            self._ended[pull.request_id] = pull.deadline
            self._sent.append(pull.request_id)
        self.blocks_sent += len(pull.block_ids)
        self.bytes_sent += payload.nbytes
        return [encode(PullReply(num_blocks=len(pull.block_ids))), memoryview(payload.view(torch.uint8).numpy())]

    def _refusal(self, pull: PullRequest) -> str | None:
        if pull.engine_id != self.engine_id:
            return f"unknown engine {pull.engine_id!r} (this is {self.engine_id!r})"
        if pull.layout is None:
            return "the pull does not say its KV layout"
        if why := self.layout.mismatch(pull.layout):
            return why
        if not verify(self.secret, pull.request_id, pull.held, pull.deadline, pull.token):
            return f"no blocks {pull.held} are held for request {pull.request_id!r} under that token"
        if not set(pull.block_ids) <= set(pull.held):
            return f"blocks {sorted(set(pull.block_ids) - set(pull.held))} are not held for request {pull.request_id!r}"
        if time.monotonic() >= pull.deadline:
            return f"the hold of request {pull.request_id!r} has expired"
        return None
