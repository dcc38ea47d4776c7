"""GrammarCompiler: constraints compiled into token-level grammars (xgrammar), off the step loop.
Compiles run in a thread pool (the library lets go of the GIL), at most one per distinct
constraint: requests with the same constraint share it, and it stays cached for those that
come later, as does a failure. A request waits for its grammar while the engine steps on; one
whose grammar is not ready within the time limit fails with a 400 naming its field (the
compile itself cannot be interrupted: it finishes in the background and is cached).

Why xgrammar: bench/structured.py compares it with llguidance on this vocabulary; its masks
cost a fifth of llguidance's per token, which every step pays, while its compile, which it
pays once per constraint, is cached and kept off the step loop here."""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections import OrderedDict
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import TYPE_CHECKING

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.json_schema import check_regex, check_schema, exact_formats
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.text.tokenizer import Tokenizer

if TYPE_CHECKING:  # imported where a grammar is compiled: an engine serves without it
    import xgrammar as xgr

COMPILE_THREADS = 2
CACHED_GRAMMARS = 256  # distinct constraints kept compiled, least recently used out first
_LIBRARY_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[19:51:01] /project/cpp/x.cc:94: "


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]) -> xgr.TokenizerInfo:
    """The vocabulary as the grammar library reads it: each token's raw bytes (special tokens
    as nothing, so that no grammar produces them), padded to the model's vocab_size."""
    import xgrammar as xgr

    special = tokenizer.special_ids
    vocab = [b"" if i in special else raw for i, raw in enumerate(tokenizer.vocab_bytes)]
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids))


class GrammarCompiler:
    def __init__(
        self, tokenizer_folder: Path, vocab_size: int, eos_token_ids: list[int], timeout: float, max_whitespace: int
    ):
        # The tokenizer is read by the first compile: an engine that is never asked for a
        # constraint spends nothing on it at start-up.
        self.tokenizer_folder, self.vocab_size, self.eos_token_ids = tokenizer_folder, vocab_size, eos_token_ids
        self._compiler: xgr.GrammarCompiler | None = None  # made by the first compile (a third of a second)
        self._compiler_lock = threading.Lock()
        self.timeout, self.max_whitespace = timeout, max_whitespace
        self.pool = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar-compile")
        self.compiles: OrderedDict[str, Future] = OrderedDict()
        self.compile_seconds: list[float] = []  # of each compile finished since the last take

    @functools.cached_property
    def tokenizer(self) -> Tokenizer:
        return Tokenizer(self.tokenizer_folder)

    @property
    def vocab_bytes(self) -> list[bytes]:
        return self.tokenizer.vocab_bytes

    def submit(self, params: StructuredOutputsParams) -> str:
        """Starts (or finds) the compile of `params`' constraint; returns its key."""
        key = params.key
        if key in self.compiles:
            self.compiles.move_to_end(key)
            return key
        self.compiles[key] = self.pool.submit(self._compile, params)
        while len(self.compiles) > CACHED_GRAMMARS:
            self.compiles.popitem(last=False)  # a request waiting on it still holds its future
        return key

    def ready(self, params: StructuredOutputsParams, since: float, now: float) -> bool:
        """Whether the grammar of `params` is compiled; raises InvalidRequestError when it failed,
        or when a request that asked for it at `since` has waited past the time limit."""
        future = self.compiles.get(params.key)
        if future is None:  # evicted while the request waited: compiled again
            self.submit(params)
            return False
        if future.done():
            future.result()  # raises the compile's error
            return True
        if now - since > self.timeout:
            raise InvalidRequestError(
                f"{params.field}: the {params.kind} grammar did not compile within the time limit "
                f"({self.timeout:g} s); simplify it",
                param=params.field,
            )
        return False

    def __getitem__(self, key: str) -> xgr.CompiledGrammar:
        return self.compiles[key].result()

    def wait_any(self, keys: set[str], timeout: float) -> None:
        """Blocks until one of the compiles of `keys` is done, or `timeout` seconds pass."""
        futures = [self.compiles[k] for k in keys if k in self.compiles]
        if futures:
            wait(futures, timeout, return_when=FIRST_COMPLETED)

    def take_compile_seconds(self) -> list[float]:
        seconds, self.compile_seconds = self.compile_seconds, []
        return seconds

    def _compile(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        started = time.perf_counter()
        try:
            compiled = self._compile_kind(params)
        except InvalidRequestError:
            raise
        except ImportError as exc:
            raise InvalidRequestError(
                f"{params.field}: this server cannot hold outputs to constraints ({exc}; pip install xgrammar)",
                param=params.field,
            ) from exc
        except Exception as exc:  # the library's own message names what is wrong
            message = _LIBRARY_PREFIX.sub("", str(exc).strip())
            raise InvalidRequestError(f"{params.field}: invalid {params.kind}: {message}", param=params.field) from exc
        self.compile_seconds.append(time.perf_counter() - started)
        return compiled

    @property
    def compiler(self) -> xgr.GrammarCompiler:
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar as xgr

                info = tokenizer_info(self.tokenizer, self.vocab_size, self.eos_token_ids)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _compile_kind(self, params: StructuredOutputsParams) -> xgr.CompiledGrammar:
        kind, compiler = params.kind, self.compiler
        if kind in ("json", "json_object"):
            schema = json.loads(params.json) if kind == "json" else {"type": "object"}
            check_schema(schema, params.field)
            return compiler.compile_json_schema(
                json.dumps(exact_formats(schema)),
                any_whitespace=not params.disable_any_whitespace,
                max_whitespace_cnt=self.max_whitespace,
            )
        if kind == "regex":
            check_regex(params.regex, params.field, params.field)
            return compiler.compile_regex(params.regex)
        if kind == "choice":
            return compiler.compile_grammar(choice_grammar(params.choice))
        if "::=" in params.grammar:  # EBNF (GBNF); otherwise Lark, as vLLM reads either
            return compiler.compile_grammar(params.grammar)
        return compiler.compile_lark(params.grammar)


def choice_grammar(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are the choices, exactly."""
    return "root ::= " + " | ".join(json.dumps(choice, ensure_ascii=False) for choice in choices)
