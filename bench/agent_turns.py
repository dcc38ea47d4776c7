"""An agent's conversation of many turns through the Responses API on the default model, while
other traffic churns through the prefix cache between its turns: each turn's time to first token,
served five ways side by side in one run (the servers take turns, one at a time):

- `previous_response_id`: each turn sends only its new item (a tool's observation), the server
  carrying the conversation on, its blocks pinned (--responses-kv-pin, 300 s by default);
- `resend`: each turn resends the whole history as input items (each stored, so pinned too);
- each again on a server started with --responses-kv-pin 0;
- the floor: `previous_response_id` with no other traffic, nothing ever evicted: what the turns
  cost when the whole history is served from the cache.

    python bench/agent_turns.py [--turns 20] [--churn-tokens 7000] [--kv-cache-memory 146800640]

Turn 1 states a task (about 320 tokens with the chat template); every later turn adds an
observation of about 80 tokens; each answer is at most 24 tokens, greedy. Between turns, other
prompts of about 1000 tokens each, all different, are served one after another (1 output token
each) until --churn-tokens have passed: more than the whole cache (398 blocks of 16 tokens at
the default size), so that what is not pinned is evicted. The pin cap (half the blocks) holds the
conversation at turn 20 (about 2.6k tokens). Issue 47's target: turn 20's TTFT at most 1.1x turn
2's with previous_response_id."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import httpx
from servers import free_port, running

MODEL = "bench"
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fable", "garnet", "harbor", "indigo", "juniper", "kelp"]
TASK = (
    "You are an agent repairing a build. The repository has a failing test suite; each turn you "
    "receive the output of the last command you ran. Answer with the next command to run and one "
    "sentence on why. " + " ".join(f"Constraint {i}: keep module {WORDS[i % len(WORDS)]} stable." for i in range(24))
)
CHURN_WORDS = 700  # about 1000 tokens
MODES = {  # --responses-kv-pin; whether a turn names the previous response (else resends the history); churn
    "previous_response_id": (300.0, True, True),
    "previous_response_id, no pin": (0.0, True, True),
    "resend, pinned": (300.0, False, True),
    "resend, no pin": (0.0, False, True),
    "floor: no churn": (300.0, True, False),
}
FLOOR = "floor: no churn"


def observation(turn: int) -> str:
    lines = [f"step {turn}.{i}: {WORDS[(turn + i) % len(WORDS)]} check passed in {turn * 7 + i} ms" for i in range(5)]
    return "Command output:\n" + "\n".join(lines)


def churn(client: httpx.Client, turn: int, tokens: int) -> int:
    """Serves other prompts until `tokens` prompt tokens have passed; returns how many did. Each
    begins with its own header, so no block of one is a cached block of another."""
    served, p = 0, 0
    while served < tokens:
        words = " ".join(WORDS[(p + 3 * j) % len(WORDS)] for j in range(CHURN_WORDS))
        body = {"model": MODEL, "prompt": f"Report {turn}.{p}. {words}", "max_tokens": 1}
        answer = client.post("/v1/completions", json=body, timeout=600)
        answer.raise_for_status()
        served, p = served + answer.json()["usage"]["prompt_tokens"], p + 1
    return served


def turn_ttft(client: httpx.Client, body: dict) -> tuple[float, dict]:
    """(seconds to the first output event, the final response) of one streamed turn."""
    start, first, final = time.perf_counter(), None, None
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}, timeout=600) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if first is None and event["type"].endswith(".delta"):
                first = time.perf_counter() - start
            if event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
    return first if first is not None else time.perf_counter() - start, final


def conversation(url: str, chained: bool, turns: int, churn_tokens: int) -> list[tuple[float, int, int]]:
    """(TTFT, cached input tokens, input tokens) of each turn."""
    figures, history, previous = [], [], None
    with httpx.Client(base_url=url) as client:
        for turn in range(1, turns + 1):
            item = {"role": "user", "content": TASK if turn == 1 else observation(turn)}
            base = {"model": MODEL, "max_output_tokens": 24, "temperature": 0}
            if chained:
                body = {**base, "input": [item], **({"previous_response_id": previous} if previous else {})}
            else:
                body = {**base, "input": [*history, item]}
            ttft, response = turn_ttft(client, body)
            usage = response["usage"]
            figures.append((ttft, usage["input_tokens_details"]["cached_tokens"], usage["input_tokens"]))
            previous = response["id"]
            answer = "".join(
                part["text"] for out in response["output"] if out["type"] == "message" for part in out["content"]
            )
            history += [item, {"role": "assistant", "content": answer}]
            if churn_tokens:
                churn(client, turn, churn_tokens)
    return figures


def attention_ms(cached: int, new: int) -> float:
    """Milliseconds of the C++ chunk attention (every layer of the default model) for `new` query
    tokens after `cached` keys: the part of a turn's prefill that grows with the history."""
    import torch

    from argosy.kernels import cpu_kernels
    from argosy.server.models.default_model import resolve_model_path

    config = json.loads((resolve_model_path(None) / "config.json").read_text())
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, block = config["hidden_size"] // heads, 16
    blocks = (cached + new) // block + 1
    k_cache = torch.randn(blocks, block, kv_heads, head_dim, dtype=torch.bfloat16)
    q = torch.randn(new, heads, head_dim, dtype=torch.bfloat16)
    out, index = torch.empty_like(q), lambda n: torch.tensor([n])
    call = (q, k_cache, torch.randn_like(k_cache), index(0), index(new), index(cached + new))
    call += (torch.arange(blocks)[None], head_dim**-0.5, out)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(config["num_hidden_layers"]):
            cpu_kernels.paged_chunk_attention(*call)
        best = min(best, time.perf_counter() - start)
    return 1000 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--churn-tokens", type=int, default=7000)
    parser.add_argument("--kv-cache-memory", type=int, default=140 << 20)
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    args = parser.parse_args()
    from argosy.server.profile.machine import cpu_line

    results = {}
    modes = {m: MODES[m] for m in args.modes}
    for mode, (pin_s, chained, churned) in modes.items():
        port = free_port()
        command = [sys.executable, "-P", "-m", "argosy", "serve", "--port", str(port), "--served-model-name", MODEL]
        command += ["--kv-cache-memory", str(args.kv_cache_memory), "--max-model-len", "4096"]
        command += ["--responses-kv-pin", str(pin_s)]
        with running(command, port) as url:
            results[mode] = conversation(url, chained, args.turns, args.churn_tokens if churned else 0)
    churned = f"{args.churn_tokens} tokens of other prompts between them"
    cache = f"a KV cache of {args.kv_cache_memory >> 20} MiB"
    print(f"\n{cpu_line()}; the default model, {cache}, {args.turns} turns, {churned}")
    print("| turn | " + " | ".join(f"{m}: TTFT ms (cached)" for m in modes) + " |")
    print("|--:|" + "--:|" * len(modes))
    for turn in range(args.turns):
        cells = [f"{1000 * results[m][turn][0]:.0f} ({results[m][turn][1]})" for m in modes]
        print(f"| {turn + 1} | " + " | ".join(cells) + " |")
    n = args.turns
    last, floor = n - 1, results.get(FLOOR)
    head = f"TTFT turn 2, ms | TTFT turn {n}, ms | turn {n} / turn 2 | turn {n} / the floor's"
    print(f"\n| mode | {head} | median TTFT turns 2-{n}, ms |")
    print("|---|--:|--:|--:|--:|--:|")
    for mode in modes:
        ttfts = [t for t, _, _ in results[mode]]
        median = statistics.median(ttfts[1:])
        versus_floor = f"{ttfts[last] / floor[last][0]:.2f}x" if floor else "-"
        print(
            f"| {mode} | {1000 * ttfts[1]:.0f} | {1000 * ttfts[last]:.0f} | {ttfts[last] / ttfts[1]:.2f}x "
            f"| {versus_floor} | {1000 * median:.0f} |"
        )
    reference = FLOOR if floor else next(iter(modes))
    print(f"\nWhat grows with the history ({reference}): the new tokens' attention over the cached ones")
    print("| turn | cached tokens | new tokens | chunk attention, every layer, ms | TTFT, ms |")
    print("|--:|--:|--:|--:|--:|")
    for turn in (1, last):
        ttft, cached, tokens = results[reference][turn]
        new = tokens - cached
        print(f"| {turn + 1} | {cached} | {new} | {attention_ms(cached, new):.0f} | {1000 * ttft:.0f} |")


if __name__ == "__main__":
    main()
