"""One grammar compile in a process of its own, forked from the engine core with the vocabulary's
compiler already built there (building it costs most of a second; a fork, a few milliseconds), so
that a compile can be stopped (its requests went, or it ran past its time limit) and shares the
CPU with the others by the kernel's scheduling. The child runs the compiler alone, in its one
thread, and says how it went: the grammar itself never crosses back (serialized, a 50-property
schema's is 1.5 MB and costs ten times its compile; a heavy one's, 600 MB and a minute), the
device side compiles it again (grammar_store.py), now that it is known to compile within the limit."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from argosy.server.exceptions import InvalidRequestError
from argosy.server.structured.json_schema import check_regex, check_schema, exact_formats
from argosy.server.structured.params import StructuredOutputsParams
from argosy.server.text.tokenizer import Tokenizer

if TYPE_CHECKING:
    import xgrammar as xgr

_LIBRARY_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")  # "[19:51:01] /project/cpp/x.cc:94: "


@dataclass(frozen=True)
class CompileResult:
    """What a compile sends back: its time, and the error that names the field if it failed."""

    seconds: float
    error: str | None = None


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int]) -> xgr.TokenizerInfo:
    """The vocabulary as the grammar library reads it: each token's raw bytes (special tokens
    as nothing, so that no grammar produces them), padded to the model's vocab_size."""
    import xgrammar as xgr

    special = tokenizer.special_ids
    vocab = [b"" if i in special else raw for i, raw in enumerate(tokenizer.vocab_bytes)]
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=list(eos_token_ids))


def run(conn: Connection, compiler: xgr.GrammarCompiler, params: StructuredOutputsParams, max_whitespace: int) -> None:
    """The process's work: one compile, its result sent on `conn`."""
    started = time.perf_counter()
    try:
        compile_grammar(compiler, params, max_whitespace)
        result = CompileResult(time.perf_counter() - started)
    except InvalidRequestError as exc:
        result = CompileResult(time.perf_counter() - started, error=str(exc))
    except Exception as exc:  # the library's own message names what is wrong
        message = _LIBRARY_PREFIX.sub("", str(exc).strip())
        result = CompileResult(time.perf_counter() - started, error=f"{params.field}: invalid {params.kind}: {message}")
    conn.send(result)
    conn.close()


def compile_grammar(compiler: xgr.GrammarCompiler, params: StructuredOutputsParams, max_whitespace: int):
    kind = params.kind
    if kind in ("json", "json_object"):
        schema = json.loads(params.json) if kind == "json" else {"type": "object"}
        check_schema(schema, params.field)
        return compiler.compile_json_schema(
            json.dumps(exact_formats(schema)),
            any_whitespace=not params.disable_any_whitespace,
            max_whitespace_cnt=max_whitespace,
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
