"""SideChannel: the prefill side's end of a hand-off, a thread serving pulls on a ZMQ ROUTER
socket. It serves only the blocks the engine holds for the request a pull names, once, and only
to a puller whose KV layout is its own: anything else is refused in words, so a forged or stale
pull never reads another request's blocks. A pull that arrives before its hold is known here
(the answer naming the blocks can outrun the step that tells this worker) waits for it a moment.
A hold leaves the table under the same lock the
copies are made under, so blocks the engine has let go of are never read after."""

from __future__ import annotations

import logging
import threading
import time

import torch
import zmq

from argosy.server.kv_transfer.wire import KVLayout, PullReply, PullRequest, decode_request, encode

log = logging.getLogger("argosy.kv_transfer")
POLL_MS = 100
PARKED_POLL_MS = 5
HOLD_WAIT = 2.0  # seconds a pull waits for its hold to be known here


class SideChannel:
    def __init__(self, engine_id: str, layout: KVLayout, host: str, port: int):
        self.engine_id, self.layout = engine_id, layout
        self.kv_cache: torch.Tensor | None = None  # set by the worker half before any hold
        self._holds: dict[str, set[int]] = {}  # request id -> the blocks held for it
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

    def hold(self, request_id: str, block_ids: list[int]) -> None:
        with self._lock:
            self._holds[request_id] = set(block_ids)

    def release(self, request_ids: list[str]) -> None:
        """The engine let these go (pulled, or held too long): no pull reads them from now on."""
        with self._lock:
            for request_id in request_ids:
                self._holds.pop(request_id, None)

    def take_sent(self) -> list[str]:
        with self._lock:
            sent, self._sent = self._sent, []
        return sent

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        # A pull may come before the step that tells this worker of its hold (the answer naming the
        # blocks leaves as the request finishes): it waits for the hold, up to HOLD_WAIT seconds.
        parked: list[tuple[bytes, PullRequest, float]] = []
        try:
            while not self._stopped.is_set():
                if self._socket.poll(PARKED_POLL_MS if parked else POLL_MS):
                    identity, *frames = self._socket.recv_multipart()
                    pull, reply = self._read(frames)
                    if reply is None:
                        parked.append((identity, pull, time.monotonic() + HOLD_WAIT))
                    else:
                        self._socket.send_multipart([identity, *reply], copy=False)
                waiting = []
                for identity, pull, deadline in parked:
                    reply = self._blocks(pull, final=time.monotonic() >= deadline)
                    if reply is None:
                        waiting.append((identity, pull, deadline))
                    else:
                        self._socket.send_multipart([identity, *reply], copy=False)
                parked = waiting
        except Exception:
            log.exception("the KV side channel stopped")
        finally:
            self._socket.close(linger=0)
            self._context.term()

    def _read(self, frames: list[bytes]) -> tuple[PullRequest | None, list | None]:
        """The pull, and the reply to send now (None: its hold is not known yet)."""
        try:
            pull = decode_request(frames[-1])
        except Exception as exc:
            return None, [encode(PullReply(f"a malformed pull: {exc}"))]
        if pull.engine_id != self.engine_id:
            return pull, [encode(PullReply(f"unknown engine {pull.engine_id!r} (this is {self.engine_id!r})"))]
        if why := self.layout.mismatch(pull.layout):
            return pull, [encode(PullReply(why))]
        return pull, self._blocks(pull, final=False)

    def _blocks(self, pull: PullRequest, final: bool) -> list | None:
        """The blocks' reply, or a refusal; None while no hold is known for the request and not `final`."""
        with self._lock:
            held = self._holds.get(pull.request_id)
            if held is None:
                if not final:
                    return None
                why = f"no blocks are held for request {pull.request_id!r} (pulled, expired or never held)"
                return [encode(PullReply(why))]
            if not pull.block_ids or not set(pull.block_ids) <= held:
                return [encode(PullReply(f"blocks {pull.block_ids} are not all held for request {pull.request_id!r}"))]
            blocks = torch.tensor(pull.block_ids, device=self.kv_cache.device)
            payload = self.kv_cache.index_select(2, blocks).movedim(2, 0).contiguous().cpu()
            del self._holds[pull.request_id]
            self._sent.append(pull.request_id)
        self.blocks_sent += len(pull.block_ids)
        self.bytes_sent += payload.nbytes
        return [encode(PullReply(num_blocks=len(pull.block_ids))), memoryview(payload.view(torch.uint8).numpy())]
