"""GrammarStore: the device side's compiled grammars, by constraint key, compiled here from the
constraints the step plans carry. The engine core sends a constraint only once its compile has
proven, in a process of its own, to finish within the time limit (GrammarCompiler), so a compile
here is bounded; it runs in a thread (the library lets go of the GIL) while steps go on, and the
step results say which have finished, so that the engine admits a constrained request only once
its grammar is here. A grammar the store let go (least recently used, past CACHED) is compiled
again when a sequence needs it: correct, if slower.

Why here and not bitmasks from the engine: the device side samples, so its grammar states advance
with the tokens it samples, and a step planned while the previous one runs needs no round trip
for its masks; and the masks are filled on the host while the forward pass runs on a GPU."""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from argosy.server.structured import compile_job
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar as xgr

log = logging.getLogger("argosy.engine")
CACHED = 256  # grammars kept compiled, least recently used out first
THREADS = 4  # compiles at once


class GrammarStore:
    def __init__(self, tokenizer_folder: Path, vocab_size: int, eos_token_ids: list[int], max_whitespace: int):
        self.tokenizer_folder, self.vocab_size, self.eos_token_ids = tokenizer_folder, vocab_size, eos_token_ids
        self.max_whitespace = max_whitespace
        self.compiles: OrderedDict[str, Future] = OrderedDict()  # by key, least recently used first
        self._reported: dict[str, Future] = {}  # compiles whose end the next `finished` says
        self._building = threading.Lock()  # the compiler is built once, by the first compile
        self._pool = ThreadPoolExecutor(THREADS, thread_name_prefix="device-grammar")

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer(self.tokenizer_folder)

    @functools.cached_property
    def compiler(self) -> xgr.GrammarCompiler:
        import xgrammar as xgr

        info = compile_job.tokenizer_info(self.tokenizer, self.vocab_size, self.eos_token_ids)
        return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)

    @property
    def vocab_bytes(self) -> list[bytes]:
        return self.tokenizer.vocab_bytes

    def prepare(self, params: StructuredOutputsParams) -> None:
        """Starts the compile of `params` unless it is here or under way; its end is reported."""
        compile_ = self.compiles.get(params.key)
        if compile_ is None:
            compile_ = self.compiles[params.key] = self._pool.submit(self._compile, params)
            self._evict()
        self.compiles.move_to_end(params.key)
        self._reported[params.key] = compile_

    def finished(self, wait: float = 0.0) -> tuple[list[str], dict[str, str]]:
        """The keys prepared since the last call whose compile has ended (waiting up to `wait`
        seconds for one, when none has): those compiled, and why the others failed."""
        if not self._reported:  # most steps
            return [], {}
        if wait and self._reported and not any(f.done() for f in self._reported.values()):
            futures.wait(self._reported.values(), wait, return_when=futures.FIRST_COMPLETED)
        done, failed = [], {}
        for key, compile_ in list(self._reported.items()):
            if not compile_.done():
                continue
            del self._reported[key]
            error = compile_.exception()
            if error is None:
                done.append(key)
            else:
                failed[key] = f"the grammar did not compile on the device side: {type(error).__name__}: {error}"
        return done, failed

    def __getitem__(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        """The grammar of `params`, waited for (compiled again if it was let go)."""
        if params.key not in self.compiles:
            log.warning("a grammar let go was asked for again: compiling it in the step")
            self.compiles[params.key] = self._pool.submit(self._compile, params)
            self._evict()
        self.compiles.move_to_end(params.key)
        return self.compiles[params.key].result()

    def _compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        with self._building:
            compiler = self.compiler
        return compile_job.compile_grammar(compiler, params, self.max_whitespace)

    def _evict(self) -> None:
        while len(self.compiles) > CACHED:
            self.compiles.popitem(last=False)
