"""A node of a model served across nodes that runs ranks only (`argosy serve --headless
--node-rank K`): it connects to the leader at --master-addr, takes the ranks' WorkerSpec from it
(one source of truth for every node's engine settings), starts its ranks, passes each call to them
and their answers back. A rank that exits ends the node, telling the leader which rank and how;
the leader's connection closing ends it too, and so do ranks that end without the leader's word
(when the leader dies, its peers' collectives fail and they end quietly). Each way it exits
non-zero: the group is broken and is restarted as a unit. Only ranks told by the leader to shut
down end it with 0."""

from __future__ import annotations

import logging
import threading
from multiprocessing.connection import wait

import msgspec

from argosy.server.engine_config import EngineConfig
from argosy.server.executor.local_ranks import POLL_S, LocalRanks
from argosy.server.executor.node_link import ANSWER, EXITED, HELLO, SPEC, connect, link_port, recv_frame, send_frame
from argosy.server.executor.worker_calls import Shutdown, encode
from argosy.server.executor.worker_process import WorkerSpec

log = logging.getLogger("argosy.engine")
CONNECT_TIMEOUT_S = 600.0  # the leader may still be pulling its image or loading
EXIT_WAIT_S = 5.0


def run_headless(config: EngineConfig) -> int:
    """This node's part, with the leader's settings (`config` gives where the leader is and which node this is)."""
    address = (config.master_addr, link_port(config.master_port))
    sock = connect(address, CONNECT_TIMEOUT_S)
    send_frame(sock, config.node_rank, HELLO)
    frame = recv_frame(sock)
    if frame is None or frame[1] != SPEC:
        log.error("the leader at %s:%d sent no engine settings", *address)
        return 1
    spec = msgspec.msgpack.decode(frame[2], type=WorkerSpec)
    per_node = spec.config.ranks_per_node
    first = config.node_rank * per_node
    ranks = LocalRanks(spec, first, per_node)
    log.info("node %d of %d: ranks %d-%d started for the leader at %s", config.node_rank, config.nnodes,
             first, first + per_node - 1, config.master_addr)  # fmt: skip
    leader_gone, told_to_stop, shutdown = threading.Event(), threading.Event(), encode(Shutdown())

    def relay_calls() -> None:
        while (frame := recv_frame(sock)) is not None:
            if frame[2] == shutdown:
                told_to_stop.set()
            ranks.queue.put(frame[2])
        leader_gone.set()

    threading.Thread(target=relay_calls, daemon=True, name="argosy-leader-calls").start()
    try:
        return _serve(ranks, sock, first, leader_gone, told_to_stop)
    finally:
        ranks.stop()
        sock.close()


def _serve(ranks: LocalRanks, sock, first: int, leader_gone: threading.Event, told_to_stop: threading.Event) -> int:
    index_of = {conn: index for index, conn in enumerate(ranks.replies)}
    while True:
        for ready in wait([*ranks.replies, *(proc.sentinel for proc in ranks.procs)], POLL_S):
            if ready not in index_of or not ready.poll():
                continue  # a sentinel: the exit codes below tell
            index = index_of[ready]
            try:
                send_frame(sock, first + index, ANSWER, ready.recv_bytes())
            except (EOFError, OSError):  # the rank is gone: its exit code tells how, once reaped
                ranks.procs[index].join(EXIT_WAIT_S)
        codes = [proc.exitcode for proc in ranks.procs]
        ending = node_ending(codes, told_to_stop.is_set(), leader_gone.is_set())
        if ending is None:
            continue
        code, failed, why = ending
        if failed is not None:
            why = f"{ranks.name(first + failed)} {why}"
            send_frame(sock, first + failed, EXITED, why.encode())
        if code:
            log.error("%s: the node stops", why)
        return code


def node_ending(codes: list[int | None], told_to_stop: bool, leader_gone: bool) -> tuple[int, int | None, str] | None:
    """Whether the node ends, from its ranks' exit codes (None: running) and what the leader did:
    (the node's exit code, the index of the rank that failed or None, why); None while it serves."""
    failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
    if failed is not None:
        return 1, failed, f"exited (code {codes[failed]})"
    if told_to_stop:  # once its ranks are done, or the leader is
        return (0, None, "told to shut down by the leader") if leader_gone or all(c == 0 for c in codes) else None
    if leader_gone:
        return 1, None, "the leader closed its connection"
    if 0 in codes:
        return 1, None, "a rank ended without the leader telling it to (the leader is gone)"
    return None
