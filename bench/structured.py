"""Structured outputs, measured side by side in one run.

    python bench/structured.py [--model PATH] [--max-tokens 64] [--repeats 3] [--concurrency 1 16 64]

Throughput: the same requests (2 x concurrency prompts of 64 tokens, at least 4; greedy, every
request to --max-tokens) served unconstrained and with every request held to one JSON schema
(a list of at least 100 objects, so that no output completes before --max-tokens), by engines
whose batch is the concurrency. Output tokens/s, best of --repeats, the two taken in turn each
repeat, and their ratio.

Then: the grammar's cost per constrained sequence per step (the batched mask fill, its
application to the logits and the matcher's advance), for a batch of 64 sequences walking a
valid document; a 50-property schema's compile, cold and cached; and, where llguidance is
installed (`pip install -e '.[bench]'`), xgrammar beside it on this vocabulary: compile time and
mask + advance per token, the measurement that chose xgrammar."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import xgrammar as xgr

from argosy import LLM, SamplingParams, StructuredOutputsParams
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig
from argosy.server.structured.compile_job import compile_grammar, tokenizer_info
from argosy.server.structured.grammar_compiler import GrammarCompiler
from argosy.server.structured.grammar_mask import GrammarMask, GrammarState, Vocabulary
from argosy.server.structured.grammar_store import GrammarStore
from argosy.server.text.tokenizer import Tokenizer

KV_CACHE_BYTES = 1 << 30
ITEM = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999}, "name": {"type": "string"}},
    "required": ["id", "name"],
}
LONG_LIST = {"type": "array", "items": ITEM, "minItems": 100}
FIFTY = {
    "type": "object",
    "properties": {f"field_{i}": {"type": ["string", "integer", "boolean"][i % 3]} for i in range(50)},
    "required": [f"field_{i}" for i in range(50)],
}
NESTED_PATTERNS = {
    "type": "object",
    "properties": {
        f"q{i}": {
            "type": "object",
            "properties": {f"r{j}": {"type": "string", "pattern": "^[a-z]{3,9}$"} for j in range(10)},
            "required": [f"r{j}" for j in range(10)],
        }
        for i in range(40)
    },
    "required": [f"q{i}" for i in range(40)],
}


def throughput_rows(model: str, args) -> list[tuple[int, float, float]]:
    vocab = ModelConfig.from_folder(model).vocab_size
    rows = []
    for concurrency in args.concurrency:
        count = max(4, 2 * concurrency)
        prompts = [{"prompt_token_ids": [(1000 + 37 * i + 11 * j) % vocab for j in range(64)]} for i in range(count)]
        llm = LLM(model, dtype=args.dtype, kv_cache_memory=KV_CACHE_BYTES, max_num_seqs=concurrency)
        plain = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        constraint = StructuredOutputsParams(json=LONG_LIST)
        held = SamplingParams(
            temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True, structured_outputs=constraint
        )
        llm.generate(prompts[:2], held)  # compiles the grammar, warms both paths
        best = {"plain": 0.0, "held": 0.0}
        for _ in range(args.repeats):
            for name, params in (("plain", plain), ("held", held)):
                start = time.perf_counter()
                outputs = llm.generate(prompts, params)
                tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                best[name] = max(best[name], tokens / (time.perf_counter() - start))
        rows.append((concurrency, best["plain"], best["held"]))
        print(f"  concurrency {concurrency}: {best['plain']:.1f} vs {best['held']:.1f} tok/s", flush=True)
        del llm
    return rows


def mask_cost(tokenizer: Tokenizer, store: GrammarStore, vocab_size: int, batch: int = 64) -> float:
    """Microseconds per sequence per step: fill, apply, advance, for `batch` sequences in step."""
    grammar = store[StructuredOutputsParams(json=FIFTY)]
    document = json.dumps({f"field_{i}": ["some text", 12345, True][i % 3] for i in range(50)})
    token_ids = tokenizer.encode(document, False)
    vocab = Vocabulary(tokenizer.vocab_bytes, vocab_size)
    states = [GrammarState.start(grammar, [tokenizer.eos_token_id], vocab, json=True) for _ in range(batch)]
    seqs = [type("Seq", (), {"grammar": s})() for s in states]
    mask, logits = GrammarMask(), torch.zeros(batch, vocab_size)
    rows = list(range(batch))
    start = time.perf_counter()
    for token in token_ids:
        mask.apply(logits, rows, seqs)
        for state in states:
            state.accept(token)
    return (time.perf_counter() - start) / len(token_ids) / batch * 1e6


def compile_times(model: Path, tokenizer: Tokenizer, vocab_size: int, eos: list[int]) -> tuple[float, float, float]:
    """A 50-property schema's compile (ms) as the server compiles it (proven in a forked process,
    then compiled on the device side), the same in this process (the library alone), then the
    cached lookup (us). Each on a compiler whose vocabulary's tables are built (once per server)."""
    compiler = GrammarCompiler(model, vocab_size, eos, timeout=60, max_whitespace=16)
    store = GrammarStore(model, vocab_size, eos, max_whitespace=16)

    def served(params: StructuredOutputsParams) -> None:
        compiler.compile_now(params)
        store[params]

    served(StructuredOutputsParams(regex="a"))
    start = time.perf_counter()
    served(StructuredOutputsParams(json=FIFTY))
    forked = time.perf_counter() - start
    start = time.perf_counter()
    served(StructuredOutputsParams(json=FIFTY))
    cached = time.perf_counter() - start
    inner = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, eos), max_threads=1, cache_enabled=False)
    compile_grammar(inner, StructuredOutputsParams(regex="a"), 16)
    start = time.perf_counter()
    compile_grammar(inner, StructuredOutputsParams(json=FIFTY), 16)
    alone = time.perf_counter() - start
    return forked * 1e3, alone * 1e3, cached * 1e6


def library_rows(model, tokenizer: Tokenizer, vocab_size: int, eos: list[int]) -> list[tuple] | None:
    """Each library's compile and step, both in this process, on the same vocabulary."""
    try:
        import llguidance
        import llguidance.torch as llg_torch
    except ImportError:
        return None
    llg_tokenizer = llguidance.LLTokenizer((model / "tokenizer.json").read_text())
    rows = []
    documents = {
        "50 properties": (FIFTY, {f"field_{i}": ["some text", 12345, True][i % 3] for i in range(50)}),
        "40 x 10 patterns": (NESTED_PATTERNS, {f"q{i}": {f"r{j}": "abcdef" for j in range(10)} for i in range(40)}),
    }
    inner = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, eos), max_threads=1, cache_enabled=False)
    for name, (schema, document) in documents.items():
        token_ids = tokenizer.encode(json.dumps(document), False)
        start = time.perf_counter()
        grammar = inner.compile_json_schema(json.dumps(schema))
        xgr_compile = time.perf_counter() - start
        matcher, bitmask = xgr.GrammarMatcher(grammar), xgr.allocate_token_bitmask(1, len(tokenizer.vocab_bytes))
        start = time.perf_counter()
        for token in token_ids:
            matcher.fill_next_token_bitmask(bitmask)
            matcher.accept_token(token)
        xgr_step = (time.perf_counter() - start) / len(token_ids)
        start = time.perf_counter()
        llg_matcher = llguidance.LLMatcher(
            llg_tokenizer, llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        )
        llg_compile = time.perf_counter() - start
        llg_mask = llg_torch.allocate_token_bitmask(1, llg_tokenizer.vocab_size)
        start = time.perf_counter()
        for token in token_ids:
            llg_torch.fill_next_token_bitmask(llg_matcher, llg_mask, 0)
            llg_matcher.consume_token(token)
        llg_step = (time.perf_counter() - start) / len(token_ids)
        rows.append((name, xgr_compile * 1e3, xgr_step * 1e6, llg_compile * 1e3, llg_step * 1e6))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    model = resolve_model_path(args.model)
    config = ModelConfig.from_folder(model)
    tokenizer = Tokenizer(model)
    eos = list(config.eos_token_ids) or [tokenizer.eos_token_id]

    print(f"model {model.name}, {args.max_tokens} output tokens per request, best of {args.repeats}")
    rows = throughput_rows(str(model), args)
    print("\n| concurrency | unconstrained tok/s | JSON-schema constrained tok/s | ratio |")
    print("|---:|---:|---:|---:|")
    for concurrency, plain, held in rows:
        print(f"| {concurrency} | {plain:.1f} | {held:.1f} | {held / plain:.2f}x |")

    store = GrammarStore(model, config.vocab_size, eos, max_whitespace=16)
    forked, alone, cached = compile_times(model, tokenizer, config.vocab_size, eos)
    per_sequence = mask_cost(tokenizer, store, config.vocab_size)
    print("\n| grammar cost | value |")
    print("|---|---:|")
    print(f"| mask fill + apply + advance, per sequence per step (batch 64) | {per_sequence:.1f} us |")
    served = "as served (proven in a forked process, then compiled on the device side)"
    print(f"| 50-property schema compile, cold, {served} | {forked:.1f} ms |")
    print(f"| 50-property schema compile, cold, the library alone in this process | {alone:.1f} ms |")
    print(f"| 50-property schema compile, cached | {cached:.0f} us |")

    libraries = library_rows(model, tokenizer, config.vocab_size, eos)
    if libraries is None:
        print("\n(llguidance is not installed: no library comparison)")
        return
    print("\n| schema | xgrammar compile | xgrammar mask + advance | llguidance compile | llguidance mask + advance |")
    print("|---|---:|---:|---:|---:|")
    for name, xc, xs, lc, ls in libraries:
        print(f"| {name} | {xc:.1f} ms | {xs:.1f} us/token | {lc:.1f} ms | {ls:.1f} us/token |")


if __name__ == "__main__":
    main()
