"""Offline throughput: N concurrent requests on one model, Argosy's engine next to
Hugging Face `generate` (one padded batch of the same prompts), measured in one run, in two
scenarios: every request generates exactly --max-tokens tokens (eos ignored), and every
request stops at its natural end of sequence (at most 2 x --max-tokens).

    python bench/throughput.py [--num-requests 32] [--max-tokens 128] [--model PATH]
"""

from __future__ import annotations

import argparse
import time

import torch

QUESTIONS = [
    "What is the capital of France?",
    "Explain photosynthesis in one paragraph.",
    "Write a haiku about the sea.",
    "How do vaccines work?",
    "List three uses of copper.",
    "Why is the sky blue?",
    "Describe a cat to someone who has never seen one.",
    "What is a prime number?",
    "Give me a recipe for pancakes.",
    "Who wrote Hamlet?",
    "What causes earthquakes?",
    "Summarise the plot of Cinderella.",
    "How does a bicycle stay upright?",
    "What is machine learning?",
    "Tell me a joke about computers.",
    "How many planets are in the solar system?",
]


def prompts(tokenizer, count: int) -> list[list[int]]:
    result = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)] + (" Answer briefly." if i >= len(QUESTIONS) else "")
        text = tokenizer.apply_chat_template([{"role": "user", "content": question}])
        result.append(tokenizer.encode(text, add_special_tokens=False))
    return result


def run_argosy(llm, batch: list[list[int]], max_tokens: int, ignore_eos: bool) -> tuple[float, int]:
    from argosy import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in batch], params)
    return time.perf_counter() - start, sum(len(o.outputs[0].token_ids) for o in outputs)


def run_hf(model, batch: list[list[int]], max_tokens: int, ignore_eos: bool) -> tuple[float, int]:
    width = max(map(len, batch))
    pad = model.config.pad_token_id or 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=model.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=model.device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_tokens,
            min_new_tokens=max_tokens if ignore_eos else 0,
            pad_token_id=pad,
        )
    seconds = time.perf_counter() - start
    eos = model.generation_config.eos_token_id
    tokens = 0
    for row in out[:, width:].tolist():  # a finished row is padded until the whole batch ends
        tokens += row.index(eos) + 1 if (eos in row and not ignore_eos) else len(row)
    return seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded model)")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from argosy import LLM
    from argosy.server.models.default_model import resolve_model_path

    llm = LLM(args.model)
    path = str(resolve_model_path(args.model))
    hf = (
        AutoModelForCausalLM.from_pretrained(path, dtype=llm.engine.core.dtype).to(llm.engine.core.runner.device).eval()
    )
    batch = prompts(llm.get_tokenizer(), args.num_requests)
    run_argosy(llm, batch[:2], 4, True)  # warm-up
    print(
        f"\n{args.num_requests} requests, {llm.engine.core.startup.line()}, {torch.get_num_threads()} threads, "
        f"prompts {min(map(len, batch))}-{max(map(len, batch))} tokens, greedy"
    )
    print(f"| {'scenario':34} | {'system':26} | {'seconds':>7} | {'tokens':>6} | {'tokens/s':>8} | {'vs HF':>6} |")
    print(f"|{'-' * 36}|{'-' * 28}|{'-' * 8}:|{'-' * 7}:|{'-' * 9}:|{'-' * 7}:|")
    scenarios = [
        (f"exactly {args.max_tokens} tokens each", args.max_tokens, True),
        (f"natural length, at most {2 * args.max_tokens}", 2 * args.max_tokens, False),
    ]
    for title, max_tokens, ignore_eos in scenarios:
        ours = run_argosy(llm, batch, max_tokens, ignore_eos)
        theirs = run_hf(hf, batch, max_tokens, ignore_eos)
        for name, (seconds, tokens) in (("argosy engine", ours), ("HF generate, padded batch", theirs)):
            ratio = (tokens / seconds) / (theirs[1] / theirs[0])
            print(
                f"| {title:34} | {name:26} | {seconds:7.2f} | {tokens:6d} | {tokens / seconds:8.1f} | {ratio:5.2f}x |"
            )


if __name__ == "__main__":
    main()
