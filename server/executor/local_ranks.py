"""LocalRanks: this node's ranks, each a spawned process that reads every call from one
shared-memory MessageQueue and answers on a pipe of its own. A rank that exits, at start-up or
later, is seen at once through its process's sentinel; the others are then stopped, so that none
is left waiting in a collective. Ranks are numbered across the whole engine: this node's are
first .. first + count - 1."""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing
import sys
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from argosy.server.executor.message_queue import MessageQueue
from argosy.server.executor.worker_calls import Shutdown, encode
from argosy.server.executor.worker_process import HELLO, WorkerSpec, worker_main

SHUTDOWN_WAIT_S = 5
POLL_S = 0.1  # how often a wait looks beyond this node's ranks (`also_check`)


class RankDiedError(RuntimeError):
    pass


class LocalRanks:
    def __init__(self, spec: WorkerSpec, first: int, count: int):
        self.first, self.count = first, count
        self.alone = spec.config.ranks == 1  # its only rank is "the worker process"
        self.queue = MessageQueue(count)
        spec = dataclasses.replace(spec, queue=self.queue.handle())
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch threads
        self.procs: list[BaseProcess] = []
        self.replies: list[Connection] = []
        for index in range(count):
            receiver, sender = ctx.Pipe(duplex=False)
            rank = first + index
            proc = ctx.Process(
                target=worker_main, args=(rank, index, spec, sender), name=f"argosy-rank-{rank}", daemon=True
            )
            proc.start()
            sender.close()
            self.procs.append(proc)
            self.replies.append(receiver)
        # Stopped with their owner, or at exit before multiprocessing's own exit hook, whose
        # one-by-one ends would let the last ranks see their peers vanish mid-collective.
        weakref.finalize(self, _stop, self.procs, self.queue)
        atexit.register(_stop, self.procs, self.queue)
        self.said_hello = [False] * count  # until it does, a rank has run none of the project's code
        for index in range(count):
            self.said_hello[index] = self.wait_for(index) == HELLO

    def put(self, message: bytes, also_check: Callable[[], None] = lambda: None) -> None:
        """`message` to every rank here; `also_check` raises if the engine is broken elsewhere."""
        self.queue.put(message, lambda: (self.check_alive(), also_check()))

    def wait_for(self, index: int, also_check: Callable[[], None] = lambda: None) -> bytes:
        """Rank `first + index`'s next answer, watching every rank here (and `also_check`) while it comes."""
        conn = self.replies[index]
        while not conn.poll():
            wait([conn, *(proc.sentinel for proc in self.procs)], POLL_S)
            self.check_alive()
            also_check()
        try:
            return conn.recv_bytes()
        except (EOFError, OSError):
            self.check_alive()
            raise

    def check_alive(self) -> None:
        """Raises if a rank has exited, every rank here stopped first."""
        for index, proc in enumerate(self.procs):
            if not proc.is_alive():
                started = self.said_hello[index] or _said_hello(self.replies[index])
                self.stop()
                why = "" if started else _never_ran()
                raise RankDiedError(f"{self.name(self.first + index)} exited (code {proc.exitcode}){why}")

    def name(self, rank: int) -> str:
        return "the worker process" if self.alone else f"rank {rank}"

    def shutdown(self) -> None:
        """Tells every rank to stop and waits a moment for them (what is left is killed)."""
        if all(proc.is_alive() for proc in self.procs):
            self.queue.put(encode(Shutdown()))
            for proc in self.procs:
                proc.join(SHUTDOWN_WAIT_S)
        self.stop()

    def stop(self) -> None:
        _stop(self.procs, self.queue)


def _said_hello(conn: Connection) -> bool:
    """Whether a rank that exited had said hello first (an answer left unread)."""
    try:
        return conn.poll() and conn.recv_bytes() == HELLO
    except (EOFError, OSError):
        return False


def _never_ran() -> str:
    """Why a rank may have ended before its first word, where the cause is a usual one."""
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) is None and getattr(main, "__file__", None):
        return (
            f" before it ran: each rank is a spawned process that imports {main.__file__} again, so the code that "
            'starts the engine there must sit under `if __name__ == "__main__":`'
        )
    return " before it ran (its error is in the log above)"


def _stop(procs: list[BaseProcess], queue: MessageQueue) -> None:
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(10)
    queue.close()
