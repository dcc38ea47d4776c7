"""SideChannel: the prefill side's end of a hand-off, a thread serving pulls on a ZMQ ROUTER
socket. It serves the blocks a pull names when the pull carries the engine's token for exactly
those blocks of that request (hold_token.py), before the hold ends, once, and only to a puller
whose KV layout is its own; anything else is refused in words, so a forged or stale pull never
reads another request's blocks. A hold the engine ends early (its pull reported, or its request
gone) is revoked here under the same lock the copies are made under, before any step can reuse
its blocks. With NIXL it answers where the blocks are instead of what they hold; the hold lasts
until the puller's READ notifies it is done (the engine lends it a longer deadline meanwhile)."""

from __future__ import annotations

import logging
import os
import threading
import time

import torch
import zmq

from argosy.server.exceptions import EndpointInUseError
from argosy.server.kv_transfer.hold_token import verify
from argosy.server.kv_transfer.nixl_transport import NixlTransport
from argosy.server.kv_transfer.wire import KVLayout, PullReply, PullRequest, decode_request, encode

log = logging.getLogger("argosy.kv_transfer")
POLL_MS = 100
NIXL_POLL_MS = 5  # with NIXL, READs done are heard of between pulls


class SideChannel:
    def __init__(self, engine_id: str, layout: KVLayout, host: str, port: int, nixl: NixlTransport | None = None):
        self.engine_id, self.layout, self.nixl = engine_id, layout, nixl
        self.secret = os.urandom(32)  # the engine signs holds with it
        self.kv_cache: torch.Tensor | None = None  # set by the worker half before any hold
        self._ended: dict[str, float] = {}  # request id -> its hold's deadline: pulled or revoked
        self._sent: list[str] = []  # requests whose blocks were pulled, since the last report
        self._lent: list[str] = []  # requests whose blocks a NIXL READ is taking, since the last report
        self._lock = threading.Lock()
        self.blocks_sent = self.bytes_sent = 0
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            bound = self._socket.bind_to_random_port(f"tcp://{host}") if port == 0 else None
            if bound is None:
                self._socket.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            self._context.term()
            where = f"tcp://{host}:{port}"
            raise EndpointInUseError(f"kv_transfer_config: the side channel {where} cannot be bound: {exc}") from exc
        self.host, self.port = host, bound or port
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kv-side-channel", daemon=True)
        self._thread.start()

    @property
    def block_bytes(self) -> int:
        """One block of every layer's K and V."""
        layers, kv = self.kv_cache.shape[:2]
        return layers * kv * self.kv_cache[0, 0, 0].nbytes

    def revoke(self, holds: list[tuple[str, float]]) -> None:
        """(request id, deadline) of holds the engine ended: no pull reads them from now on."""
        now = time.monotonic()
        with self._lock:
            self._ended = {r: d for r, d in self._ended.items() if d > now}  # past their deadline anyway
            self._ended.update(holds)

    def take_sent(self) -> tuple[list[str], list[str]]:
        """The requests whose blocks were pulled, and those lent to a NIXL READ not done yet, since the last call."""
        with self._lock:
            sent, self._sent = self._sent, []
            lent, self._lent = self._lent, []
        return sent, lent

    def _reads_done(self) -> None:
        """The NIXL READs that said they are done: their holds were pulled."""
        for message in self.nixl.notifs():
            request_id = message.decode(errors="replace")
            with self._lock:
                self._sent.append(request_id)

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            while not self._stopped.is_set():
                if self._socket.poll(POLL_MS if self.nixl is None else NIXL_POLL_MS):
                    identity, *frames = self._socket.recv_multipart()
                    self._socket.send_multipart([identity, *self._answer(frames)], copy=False)
                if self.nixl is not None:
                    self._reads_done()
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
        with self._lock:  # a revoke waits for the copy: blocks are never reused while they are read
            if pull.request_id in self._ended:
                return [encode(PullReply(f"the blocks of request {pull.request_id!r} were pulled or let go"))]
            self._ended[pull.request_id] = pull.deadline  # one pull a hold
            if pull.nixl and pull.block_ids:  # read by the puller: held until its READ says it is done
                agent, descs = self.nixl.source(self.kv_cache, pull.block_ids)
                self._lent.append(pull.request_id)
                self.blocks_sent += len(pull.block_ids)
                self.bytes_sent += len(pull.block_ids) * self.block_bytes
                reply = PullReply(num_blocks=len(pull.block_ids), nixl_agent=agent, nixl_descs=descs)
                return [encode(reply), b""]
            # In the cache's own order, the blocks third: one gather, no transposing copy; none: a release.
            payload = memoryview(self.kv_cache.index_select(2, blocks).cpu().view(torch.uint8).numpy())
            self._sent.append(pull.request_id)
        self.blocks_sent += len(pull.block_ids)
        self.bytes_sent += len(pull.block_ids) * self.block_bytes
        return [encode(PullReply(num_blocks=len(pull.block_ids))), payload]

    def _refusal(self, pull: PullRequest) -> str | None:
        if pull.engine_id != self.engine_id:
            return f"unknown engine {pull.engine_id!r} (this is {self.engine_id!r})"
        if pull.layout is None:
            return "the pull does not say its KV layout"
        if pull.nixl and self.nixl is None:
            return "the prefill side has no NIXL transport: both sides need the same kv_connector"
        if why := self.layout.mismatch(pull.layout):
            return why
        if not verify(self.secret, pull.request_id, pull.held, pull.deadline, pull.token):
            return f"no blocks {pull.held} are held for request {pull.request_id!r} under that token"
        if not set(pull.block_ids) <= set(pull.held):
            return f"blocks {sorted(set(pull.block_ids) - set(pull.held))} are not held for request {pull.request_id!r}"
        if time.monotonic() >= pull.deadline:
            return f"the hold of request {pull.request_id!r} has expired"
        return None
