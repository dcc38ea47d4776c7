"""One stream's latency against this machine's limits, measured in one run: the prefill of a
fresh prompt against the rate of its weight products, and the batch-1 decode step against the
time to read the weights once at the memory bandwidth measured here.

    python bench/latency.py [--model PATH] [--prompt-tokens 512 1024 2048] [--repeats 3]

Prefill: a fresh prompt (nothing cached) of each length, one step (max_num_batched_tokens is
raised to the longest), timed to its first token; GFLOP/s counts the weight products only, 2 x
(decoder linear parameters) per prompt token plus the LM head's for the one row it samples.
Then one layer's attention over each fresh prompt, the
CPU chunk kernel beside PyTorch's fused attention (the path before it). Decode: a 64-token
prompt decoding 128 tokens alone; the time per step (after the first token)
against the weights' bytes, those a step reads (every linear layer, the LM head, the norms;
one embedding row), over the bandwidth of the fastest of a copy and a sum of a tensor 16x the
processor's last-level cache. Best of --repeats each. Last, the decoder's and head's products
alone at 1, 5 (a speculative step's verification at k = 4) and 16 rows, Argosy's paired
bfloat16 kernel beside oneDNN's packed products, over weights of the model's shapes, each
layer its own (so they come from memory, as in a step)."""

from __future__ import annotations

import argparse
import random
import time

import torch

from argosy import LLM, SamplingParams
from argosy.kernels import cpu_kernels
from argosy.kernels.kv_cache_ops import write_kv
from argosy.kernels.paged_attention import build_metadata, paged_attention
from argosy.server.models.linear import Linear
from argosy.server.models.model_config import ModelConfig

BLOCK = 16


def memory_bandwidth(repeats: int) -> float:
    """Bytes per second: the better of reading a large tensor (sum) and copying it (read + write)."""
    x = torch.ones(256 * 1024 * 1024 // 4, dtype=torch.float32)  # 256 MiB, far past any cache
    y = torch.empty_like(x)
    best = 0.0
    for _ in range(repeats + 1):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start))
        start = time.perf_counter()
        y.copy_(x)
        best = max(best, 2 * x.numel() * 4 / (time.perf_counter() - start))
    return best


def weight_bytes_and_params(model: torch.nn.Module, itemsize: int) -> tuple[int, int, int]:
    """(bytes a decode step reads, decoder linear parameters, LM-head parameters); the LM head is
    the embedding where the two are tied."""
    decoder_params = sum(m.out_features * m.in_features for m in model.modules() if isinstance(m, Linear))
    head = model.lm_head
    head_params = head.out_features * head.in_features if head is not None else model.embed_tokens.weight.numel()
    if head is not None:
        decoder_params -= head_params
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    return (decoder_params + head_params + norms) * itemsize, decoder_params, head_params


def attention_ms(cfg: ModelConfig, dtype: torch.dtype, n: int, use_cpu_kernels: bool, repeats: int) -> float:
    """One layer's attention over a fresh n-token prompt, its keys in a paged cache."""
    g = torch.Generator().manual_seed(n)
    q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=g).to(dtype)
    k, v = (torch.randn(n, cfg.num_kv_heads, cfg.head_dim, generator=g).to(dtype) for _ in range(2))
    blocks = -(-n // BLOCK)
    k_cache = torch.zeros(blocks, BLOCK, cfg.num_kv_heads, cfg.head_dim, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    write_kv(k, v, k_cache, v_cache, torch.arange(n))
    args = (torch.arange(n), torch.tensor([0, n]), torch.tensor([n]), torch.arange(blocks)[None], BLOCK)
    meta = build_metadata(*args, use_cpu_kernels=use_cpu_kernels, direct_prefill=not use_cpu_kernels)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        paged_attention(q, k_cache, v_cache, meta, cfg.head_dim**-0.5, k, v)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def product_ms(model: torch.nn.Module, rows: int, repeats: int) -> tuple[float, float]:
    """(paired kernel, oneDNN) ms for one pass over products of the model's linear shapes."""
    shapes = [(m.out_features, m.in_features) for m in model.modules() if isinstance(m, Linear)]
    weights = [torch.randn(n, k).bfloat16() for n, k in shapes]
    paired = [cpu_kernels.pair_weight(w) for w in weights]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, None) for w in weights]
    xs = {k: torch.randn(rows, k).bfloat16() for _, k in shapes}
    passes = {
        "paired": lambda: [cpu_kernels.paired_linear(xs[k], w, None, n) for (n, k), w in zip(shapes, paired)],
        "onednn": lambda: [
            torch.ops.mkldnn._linear_pointwise(xs[k], w, None, "none", [], "") for (_, k), w in zip(shapes, packed)
        ],
    }
    best = dict.fromkeys(passes, float("inf"))
    for _ in range(repeats + 1):  # the two take turns, so drift in the machine hits both
        for name, run in passes.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return best["paired"] * 1e3, best["onednn"] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    longest = max(args.prompt_tokens)
    llm = LLM(args.model, max_num_batched_tokens=longest, max_model_len=max(longest + 1, 256))
    runner = llm.engine.core.executor.worker.runner
    itemsize = torch.empty(0, dtype=runner.dtype).element_size()
    read, decoder_params, head_params = weight_bytes_and_params(runner.model, itemsize)
    vocab = llm.engine.core.model_config.vocab_size
    rng = random.Random(0)

    def prompt(n: int) -> dict:
        return {"prompt_token_ids": [rng.randrange(1000, vocab) for _ in range(n)]}

    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([prompt(longest)], one)  # warm-up
    print(f"model {llm.engine.core.model_config.architecture}, {runner.dtype}, {torch.get_num_threads()} threads")
    print("\n| prompt tokens | prefill ms | weight GFLOP/s |")
    print("|---:|---:|---:|")
    for n in args.prompt_tokens:
        best = min(timed(llm, prompt(n), one) for _ in range(args.repeats))
        flops = 2 * decoder_params * n + 2 * head_params
        print(f"| {n} | {best * 1e3:.1f} | {flops / best / 1e9:.0f} |")

    cfg = llm.engine.core.model_config
    print("\n| prompt tokens | attention of one layer: chunk kernel ms | PyTorch fused ms | speed-up |")
    print("|---:|---:|---:|---:|")
    for n in args.prompt_tokens:
        kernel = attention_ms(cfg, runner.dtype, n, True, args.repeats)
        fused = attention_ms(cfg, runner.dtype, n, False, args.repeats)
        print(f"| {n} | {kernel:.2f} | {fused:.2f} | {fused / kernel:.1f}x |")

    decode = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    first = SamplingParams(temperature=0.0, max_tokens=1)
    steps = []
    for _ in range(args.repeats):
        p = prompt(64)
        llm.reset_prefix_cache()
        with_prefill = timed(llm, p, first)
        llm.reset_prefix_cache()
        total = timed(llm, p, decode)
        steps.append((total - with_prefill) / (args.decode_tokens - 1))
    step = min(steps)
    bandwidth = memory_bandwidth(args.repeats)
    floor = read / bandwidth
    print("\n| batch-1 decode | value |")
    print("|---|---:|")
    print(f"| weights read per step | {read / 1e6:.1f} MB |")
    print(f"| memory bandwidth measured | {bandwidth / 1e9:.1f} GB/s |")
    print(f"| time to read the weights once | {floor * 1e3:.2f} ms |")
    print(f"| decode step | {step * 1e3:.2f} ms |")
    print(f"| step / weights-read time | {step / floor:.2f}x |")

    if runner.dtype == torch.bfloat16 and cpu_kernels.kernels_built():
        print("\n| rows | products: paired kernel ms | oneDNN packed ms | speed-up | paired GB/s |")
        print("|---:|---:|---:|---:|---:|")
        for rows in (1, 5, 16):
            paired, onednn = product_ms(runner.model, rows, args.repeats)
            print(f"| {rows} | {paired:.2f} | {onednn:.2f} | {onednn / paired:.2f}x | {read / paired / 1e6:.0f} |")


def timed(llm: LLM, prompt: dict, params: SamplingParams) -> float:
    start = time.perf_counter()
    llm.generate([prompt], params)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
