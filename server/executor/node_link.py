"""The link between the leader's executor and the other nodes of a model served across nodes:
one TCP connection per node, at the leader's --master-port + 1. A node connects (retrying until
the leader listens) and says which node it is; the leader sends it the ranks' WorkerSpec, then
every call, each as one frame; the node sends back each of its ranks' answers, tagged with the
rank, and, should one of its ranks exit, which and how, before it stops the rest. Either end
seeing the connection close ends its side: the leader fails the engine naming the node, a node
stops its ranks (the group is restarted as a unit, as a LeaderWorkerSet restarts its pods)."""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time

FRAME = struct.Struct("<IiB")  # payload bytes, rank (or node), kind
HELLO, SPEC, CALL, ANSWER, EXITED = range(5)
CONNECT_RETRY_S = 0.5


def link_port(master_port: int) -> int:
    return master_port + 1  # beside torch.distributed's store at master_port


def send_frame(sock: socket.socket, rank: int, kind: int, payload: bytes = b"") -> None:
    sock.sendall(FRAME.pack(len(payload), rank, kind) + payload)


def recv_frame(sock: socket.socket) -> tuple[int, int, bytes] | None:
    """(rank, kind, payload); None once the other end has closed."""
    header = _recv_exactly(sock, FRAME.size)
    if header is None:
        return None
    length, rank, kind = FRAME.unpack(header)
    payload = _recv_exactly(sock, length) if length else b""
    return None if payload is None else (rank, kind, payload)


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def connect(address: tuple[str, int], timeout: float) -> socket.socket:
    """A connection to the leader, retried until it listens or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(address, timeout=CONNECT_RETRY_S * 4)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            if time.monotonic() > deadline:
                raise ConnectionError(f"no leader answered at {address[0]}:{address[1]} in {timeout:.0f} s") from None
            time.sleep(CONNECT_RETRY_S)


class RemoteNodes:
    """The leader's end: every other node connected, its ranks' answers queued by rank."""

    def __init__(self, port: int, nodes: int, ranks_per_node: int, spec: bytes, timeout: float, alive) -> None:
        """Waits for nodes 1 .. nodes - 1 to connect (calling `alive`, which raises if the leader's
        own ranks died meanwhile) and sends each `spec`."""
        self.ranks_per_node = ranks_per_node
        self.answers = {rank: queue.SimpleQueue() for rank in range(ranks_per_node, nodes * ranks_per_node)}
        self.failure: str | None = None
        self.links: dict[int, socket.socket] = {}
        server = socket.create_server(("", port), reuse_port=False)
        server.settimeout(CONNECT_RETRY_S)
        deadline = time.monotonic() + timeout
        try:
            while len(self.links) < nodes - 1:
                alive()
                if time.monotonic() > deadline:
                    missing = sorted(set(range(1, nodes)) - set(self.links))
                    raise ConnectionError(f"nodes {missing} did not connect to port {port} in {timeout:.0f} s")
                try:
                    sock, _ = server.accept()
                except TimeoutError:
                    continue
                sock.settimeout(None)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                hello = recv_frame(sock)
                if hello is None or hello[1] != HELLO or not 0 < hello[0] < nodes or hello[0] in self.links:
                    sock.close()
                    continue
                self.links[hello[0]] = sock
                send_frame(sock, hello[0], SPEC, spec)
        finally:
            server.close()
        for node, sock in self.links.items():
            threading.Thread(target=self._read, args=(node, sock), daemon=True, name=f"argosy-node-{node}").start()

    def _read(self, node: int, sock: socket.socket) -> None:
        while (frame := recv_frame(sock)) is not None:
            rank, kind, payload = frame
            if kind == ANSWER:
                self.answers[rank].put(payload)
            elif kind == EXITED:
                self.failure = payload.decode()
                return
        self.failure = self.failure or f"node {node} ({self._ranks(node)}) lost its connection to the leader"

    def _ranks(self, node: int) -> str:
        first, last = node * self.ranks_per_node, (node + 1) * self.ranks_per_node - 1
        return f"rank {first}" if first == last else f"ranks {first}-{last}"

    def broadcast(self, message: bytes) -> None:
        for node, sock in self.links.items():
            try:
                send_frame(sock, node, CALL, message)
            except OSError:
                self.failure = self.failure or f"node {node} ({self._ranks(node)}) lost its connection"

    def answer(self, rank: int, alive) -> bytes:
        """Rank `rank`'s next answer; `alive` raises when the engine is broken (this link's failure included)."""
        while True:
            alive()
            try:
                return self.answers[rank].get(timeout=0.05)
            except queue.Empty:
                continue

    def close(self) -> None:
        for sock in self.links.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
