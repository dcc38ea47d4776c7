"""Speculative decoding against plain decoding, side by side in one run, on the offline engine.

    python bench/spec_decode.py [--model PATH] [--draft-model PATH | --draft-layers 4] [--k 4]
                                [--max-tokens 128] [--repeats 2]

Two workloads of 16 chat requests, greedy: input-grounded (rewrite, fix or repeat a given code
snippet or paragraph: the answer copies long spans of the prompt) and random (a prompt of random
tokens). Each runs at concurrency 1 (each request alone, in turn) and 16 (all at once) on an
engine without speculation, one with prompt lookup (`ngram`, its default off-switch), and one
with prompt lookup that never turns off, so that the switch's worth shows, and one with a draft
model (`draft_model`): --draft-model, or else the target's first --draft-layers layers and its
embeddings, written beside the converted model once (a draft of the same vocabulary that no
training fitted to the layers it skips); every engine's outputs are compared with the plain
engine's. Output tokens/s is the best of --repeats; the
engines take turns, so that drift of the machine hits all of them alike. Acceptance: draft
tokens kept / proposed; mean accepted length: tokens a verification emits (kept + 1)."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

from safetensors.torch import load_file, save_file

from argosy import LLM, SamplingParams
from argosy.server.models.default_model import resolve_model_path

CODE = [
    "def total_price(items, tax_rate):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * "
    "item.quantity\n    tax = subtotal * tax_rate\n    return subtotal + tax\n",
    "class Counter:\n    def __init__(self):\n        self.counts = {}\n\n    def add(self, word):\n        self.counts"
    "[word] = self.counts.get(word, 0) + 1\n\n    def most_common(self, n):\n        return sorted(self.counts.items"
    "(), key=lambda kv: kv[1], reverse=True)[:n]\n",
    "function debounce(fn, wait) {\n  let timer = null;\n  return function (...args) {\n    clearTimeout(timer);\n"
    "    timer = setTimeout(() => fn.apply(this, args), wait);\n  };\n}\n",
    "SELECT customers.name, COUNT(orders.id) AS order_count\nFROM customers\nJOIN orders ON orders.customer_id = "
    "customers.id\nWHERE orders.created_at > '2024-01-01'\nGROUP BY customers.name\nORDER BY order_count DESC;\n",
]
PROSE = [
    "The river runs through the old town, past the market square and the stone bridge, before it turns "
    "west towards the hills. In spring the water rises and the fishermen move their boats further up the bank.",
    "Our team meets every Monday at nine to plan the week. Each person says what they finished, what they "
    "will work on next, and what is blocking them. The meeting should never take more than fifteen minutes.",
    "To reset your password, open the settings page, choose Security, and press the button labelled Reset. "
    "You will receive an email with a link; the link expires after one hour, so use it soon.",
    "The library opens at eight in the morning and closes at six in the evening on weekdays. On Saturdays "
    "it opens at ten and closes at four. It is closed on Sundays and on public holidays.",
]
CODE_TASKS = ["Rename every variable to a longer, clearer name and return the whole code:", "Add a comment line "
              "above each line of this code and return all of it:"]  # fmt: skip
PROSE_TASKS = ["Repeat this text exactly, then say how many sentences it has:", "Rewrite this text in the past "
               "tense, changing nothing else:"]  # fmt: skip


def grounded_conversations() -> list[list[dict]]:
    sources = [(task, text) for text in CODE for task in CODE_TASKS] + [
        (task, text) for text in PROSE for task in PROSE_TASKS
    ]
    return [[{"role": "user", "content": f"{task}\n\n{text}"}] for task, text in sources]


def random_prompts(llm: LLM, count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = llm.engine.core.model_config.vocab_size
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(count)]


def truncated_checkpoint(model: str | None, layers: int) -> Path:
    """The target's embeddings, first `layers` layers, final norm and head, as a checkpoint."""
    source = resolve_model_path(model)
    target = source.parent / f"{source.name}-first-{layers}-layers"
    if (target / "config.json").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.suffix != ".safetensors" and path.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(path, target / path.name)
    config = json.loads((source / "config.json").read_text())
    config["num_hidden_layers"] = layers
    tensors = {}
    for shard in source.glob("*.safetensors"):
        for name, tensor in load_file(shard).items():
            if not name.startswith("model.layers.") or int(name.split(".")[2]) < layers:
                tensors[name] = tensor
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(config, indent=2))
    return target


def run(llm: LLM, prompts, chat: bool, params: SamplingParams, concurrency: int) -> tuple[float, list, int]:
    """(seconds, outputs' token ids, output tokens)."""
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(prompts), concurrency):
        batch = prompts[i : i + concurrency]
        if chat:
            outputs += llm.chat(batch, params)
        else:
            outputs += llm.generate([{"prompt_token_ids": p} for p in batch], params)
    seconds = time.perf_counter() - start
    tokens = [o.outputs[0].token_ids for o in outputs]
    return seconds, tokens, sum(len(t) for t in tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--draft-model", default=None, help="a smaller checkpoint of the same vocabulary")
    parser.add_argument("--draft-layers", type=int, default=4, help="without --draft-model: the target's first N")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="above 16: random prompts only")
    args = parser.parse_args()
    ngram = {"method": "ngram", "num_speculative_tokens": args.k, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    draft_path = args.draft_model or str(truncated_checkpoint(args.model, args.draft_layers))
    draft = {"method": "draft_model", "model": draft_path, "num_speculative_tokens": args.k}
    print(f"draft model: {draft_path}")
    engines = {
        "none": LLM(args.model),
        "ngram": LLM(args.model, speculative_config=ngram),
        "ngram, never off": LLM(args.model, speculative_config=ngram | {"disable_by_batch_size": 1024}),
        "draft model": LLM(args.model, speculative_config=draft),
    }
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    workloads = {
        "input-grounded": (grounded_conversations(), True),
        "random": (random_prompts(engines["none"], max(16, *args.concurrency), 256), False),
    }
    print(f"k={args.k}, max_tokens={args.max_tokens}, greedy; output tokens/s, best of {args.repeats}")
    print(f"{'workload':<15} {'conc':>4} {'method':<17} {'tok/s':>7} {'vs none':>7} {'accept':>7} "
          f"{'mean len':>8} {'identical':>9}")  # fmt: skip
    for name, (prompts, chat) in workloads.items():
        for concurrency in args.concurrency:
            if concurrency > len(prompts):
                continue
            chosen = prompts[:4] if concurrency == 1 else prompts[: max(16, concurrency)]  # alone, four tell enough
            best = dict.fromkeys(engines, 0.0)
            outputs, before = {}, {m: _counts(llm) for m, llm in engines.items()}
            for _ in range(args.repeats):
                for method, llm in engines.items():
                    seconds, outputs[method], tokens = run(llm, chosen, chat, params, concurrency)
                    best[method] = max(best[method], tokens / seconds)
            for method, llm in engines.items():
                drafted, accepted, verifications = (a - b for a, b in zip(_counts(llm), before[method]))
                same = sum(a == b for a, b in zip(outputs[method], outputs["none"]))
                accept = f"{accepted / drafted:.2f}" if drafted else "-"
                mean = f"{1 + accepted / verifications:.2f}" if verifications else "-"
                print(
                    f"{name:<15} {concurrency:>4} {method:<17} {best[method]:>7.1f} "
                    f"{best[method] / best['none']:>6.2f}x {accept:>7} {mean:>8} {same:>4}/{len(chosen):<4}"
                )


def _counts(llm: LLM) -> tuple[int, int, int]:
    stats = llm.stats().spec_decode
    return (0, 0, 0) if stats is None else (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_drafts)


if __name__ == "__main__":
    main()
