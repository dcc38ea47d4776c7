"""GrammarCompiler: the engine core's admission of constraints. Each constraint's grammar is first
compiled in a process of its own (compile_job.py), stopped as soon as no request waits for it
any more, or once it runs past the time limit: what comes back is whether it compiled within the
limit (the grammar itself costs more to send back than to compile). Once it has, the device side
compiles it again for its own use (structured/grammar_store.py), now that the compile is known to be
bounded. Requests with the same constraint share one compile, and its verdict stays cached for
those that come later. Which compiles run is the CompileQueue's: the clients take turns, each
with a bounded share (more pending is a 429), so a request waits for its compile to start no
longer than the compiles ahead of it in its turn take, each at most `timeout` seconds: a compile
that runs past that is stopped, and its requests fail with a 400 naming their field (simplify it).

Why xgrammar: bench/structured.py compares it with llguidance on this vocabulary; its masks
cost a fifth of llguidance's per token, which every step pays, while its compile, which it
pays once per constraint, is cached and kept off the step loop here."""

from __future__ import annotations

import multiprocessing
import threading
import time
import warnings
from collections import OrderedDict
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured import compile_job
from argosy.server.structured.compile_queue import CompileQueue
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where a grammar is compiled: an engine serves without it
    import xgrammar as xgr

MAX_RUNNING = 4  # compiles at once, each a process
PER_CLIENT_RUNNING = 2  # of one client's
PER_CLIENT_PENDING = 8  # queued or running for one client; more is a 429
CACHED_GRAMMARS = 256  # distinct constraints kept compiled, least recently used out first


@dataclass
class _Job:
    params: StructuredOutputsParams
    waiters: int  # requests waiting for it
    started_at: float | None = None
    process: BaseProcess | None = None
    conn: Connection | None = None
    receiving: Future | None = None  # its result read back, in a thread
    result: bool | InvalidRequestError | None = None  # True: it compiles within the limit


class GrammarCompiler:
    def __init__(
        self,
        tokenizer_folder: Path,
        vocab_size: int,
        eos_token_ids: list[int],
        timeout: float,
        max_whitespace: int,
        max_running: int = MAX_RUNNING,
    ):
        self.tokenizer_folder, self.vocab_size, self.eos_token_ids = tokenizer_folder, vocab_size, eos_token_ids
        self.timeout, self.max_whitespace = timeout, max_whitespace
        self.queue = CompileQueue(max_running, PER_CLIENT_RUNNING, PER_CLIENT_PENDING)
        self.jobs: dict[str, _Job] = {}  # the constraints requests wait for, by key
        self.orphans: dict[str, _Job] = {}  # compiles here that no request waits for any more
        self.cache: OrderedDict[str, bool | InvalidRequestError] = OrderedDict()
        self.compile_seconds: list[float] = []  # of each compile finished since the last take
        # The compiler is built by a thread at the first constraint (an engine that is never asked
        # for one spends nothing on it); compiles are forked from this process once it is, and it
        # is never run here, so that no lock of the library can be held when it forks.
        self._builder: threading.Thread | None = None
        self._forked: xgr.GrammarCompiler | None = None
        self._build_error: InvalidRequestError | None = None
        self._receiver = ThreadPoolExecutor(max_running, thread_name_prefix="grammar-compile")

    def submit(self, params: StructuredOutputsParams, client: str | None) -> None:
        """A request of `client` waits for the grammar of `params`: its compile starts unless it is
        compiled or compiling; raises TooManyRequestsError when the client has its share queued."""
        key = params.key
        if (job := self.jobs.get(key)) is not None:
            job.waiters += 1
            return
        if (job := self.orphans.pop(key, None)) is not None:  # its compile here goes on for this request
            job.waiters, self.jobs[key] = 1, job
            return
        if (cached := self.cache.pop(key, None)) is not None:  # held by the job while requests wait
            self.jobs[key] = _Job(params, 1, result=cached)
            return
        self.queue.add(key, client, params.field)
        self.jobs[key] = _Job(params, 1)
        self._build()
        self._start_queued()

    def release(self, params: StructuredOutputsParams) -> None:
        """A request no longer waits for the grammar of `params` (it has it, or it went): a compile
        nobody waits for any more is stopped."""
        key = params.key
        job = self.jobs.get(key)
        if job is None:
            return
        job.waiters -= 1
        if job.waiters > 0:
            return
        del self.jobs[key]
        if job.result is not None:
            self._keep(key, job.result)
        elif job.receiving is not None:  # its verdict is being read: kept once read
            self.orphans[key] = job
        else:
            self.queue.remove(key)
            _stop(job)
            self._start_queued()

    def ready(self, params: StructuredOutputsParams) -> bool:
        """Whether the grammar of `params` has compiled within the limit; raises InvalidRequestError
        when its compile failed or ran past it."""
        result = self.jobs[params.key].result
        if isinstance(result, Exception):
            raise result
        return result is not None

    def poll(self, now: float) -> None:
        """Takes the finished compiles' results, stops those past the limit, starts queued ones."""
        for key, job in list(self.orphans.items()):
            if job.receiving.done():
                del self.orphans[key]
                self._finish(key, job)
                self._keep(key, job.result)
        for key, job in list(self.jobs.items()):
            if job.process is None or job.result is not None:
                continue
            if job.receiving is not None:
                if job.receiving.done():
                    self._finish(key, job)
            elif job.conn.poll() or not job.process.is_alive():
                job.receiving = self._receiver.submit(self._receive, job)  # the step loop goes on meanwhile
            elif now - job.started_at > self.timeout:
                _stop(job)
                self.queue.remove(key)
                job.result = InvalidRequestError(
                    f"{job.params.field}: the {job.params.kind} grammar did not compile within the time limit "
                    f"({self.timeout:g} s); simplify it",
                    param=job.params.field,
                )
        self._start_queued()

    def wait_any(self, timeout: float) -> None:
        """Blocks until a compile finishes, or `timeout` seconds pass."""
        receiving = [job.receiving for job in self.jobs.values() if job.receiving is not None and job.result is None]
        conns = [job.conn for job in self.jobs.values() if job.conn is not None and job.receiving is None]
        if receiving:
            futures.wait(receiving, timeout, return_when=futures.FIRST_COMPLETED)
        elif conns:
            wait(conns, timeout)
        elif self._builder is not None and self._builder.is_alive():
            self._builder.join(timeout)

    def compile_now(self, params: StructuredOutputsParams) -> None:
        """Waits here, as the engine core waits step by step, until the grammar of `params` has
        compiled (for benchmarks and tests, never the step loop); raises as ready() does."""
        self.submit(params, None)
        try:
            while not self.ready(params):
                self.wait_any(0.1)
                self.poll(time.monotonic())
        finally:
            self.release(params)

    def take_compile_seconds(self) -> list[float]:
        seconds, self.compile_seconds = self.compile_seconds, []
        return seconds

    def _build(self) -> None:
        if self._builder is None:
            self._builder = threading.Thread(target=self._build_compiler, name="grammar-compiler", daemon=True)
            self._builder.start()

    def _build_compiler(self) -> None:
        try:
            import xgrammar as xgr

            info = compile_job.tokenizer_info(Tokenizer(self.tokenizer_folder), self.vocab_size, self.eos_token_ids)
            self._forked = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        except ImportError as exc:
            self._build_error = InvalidRequestError(
                f"this server cannot hold outputs to constraints ({exc}; pip install xgrammar)"
            )

    def _start_queued(self) -> None:
        if self._builder is None or self._builder.is_alive():  # compiles fork once the compiler is built
            return
        now = time.monotonic()
        for key in self.queue.start():
            job = self.jobs[key]
            job.started_at = now
            if self._build_error is not None:
                self.queue.remove(key)
                job.result = InvalidRequestError(str(self._build_error), param=job.params.field)
                continue
            receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
            job.conn, job.process = receiver, _fork(sender, self._forked, job.params, self.max_whitespace)
            sender.close()

    def _receive(self, job: _Job) -> bool | InvalidRequestError:
        """The job's verdict, read from its pipe: True, or why it did not compile."""
        try:
            result: compile_job.CompileResult = job.conn.recv()
        except (EOFError, OSError):  # the process died without a word (killed from outside, out of memory)
            job.process.join()
            return InvalidRequestError(
                f"{job.params.field}: the grammar's compile failed (its process ended with code "
                f"{job.process.exitcode})",
                param=job.params.field,
            )
        self.compile_seconds.append(result.seconds)
        if result.error is not None:
            return InvalidRequestError(result.error, param=job.params.field)
        return True

    def _finish(self, key: str, job: _Job) -> None:
        self.queue.remove(key)
        job.result = job.receiving.result()
        _stop(job)

    def _keep(self, key: str, result: bool | InvalidRequestError) -> None:
        self.cache[key] = result
        while len(self.cache) > CACHED_GRAMMARS:
            self.cache.popitem(last=False)


def _fork(sender: Connection, compiler, params: StructuredOutputsParams, max_whitespace: int) -> BaseProcess:
    process = multiprocessing.get_context("fork").Process(
        target=compile_job.run, args=(sender, compiler, params, max_whitespace), name="grammar-compile", daemon=True
    )
    with warnings.catch_warnings():
        # Python 3.12 warns of forking a process with threads: the child runs the compiler alone,
        # in its one thread, taking no lock another thread of this process could hold.
        warnings.filterwarnings("ignore", message=".*fork.*", category=DeprecationWarning)
        process.start()
    return process


def _stop(job: _Job) -> None:
    """Ends the job's process, whatever it is doing, and closes its pipe (never while a thread
    reads from it)."""
    job.receiving = None
    if job.process is not None:
        if job.process.is_alive():
            job.process.kill()
        job.process.join()
        job.process.close()
        job.process = None
    if job.conn is not None:
        job.conn.close()
        job.conn = None
