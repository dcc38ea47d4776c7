"""Command-line flags of the engine, named as vLLM names them, and their EngineConfig."""
from __future__ import annotations

import argparse

from argosy.server.engine_config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine")
    g.add_argument("--model", default=None, help="checkpoint folder (Hugging Face layout); "
                                                 "default: the embedded SmolLM2-135M-Instruct")
    g.add_argument("--served-model-name", default=None, help="model name reported by the API and in metrics")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    g.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    g.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    g.add_argument("--max-model-len", type=int, default=None, help="longest prompt + output, in tokens")
    g.add_argument("--max-num-seqs", type=int, default=256, help="most sequences in one batch")
    g.add_argument("--max-num-batched-tokens", type=int, default=None, help="most tokens in one step")
    g.add_argument("--kv-cache-memory", type=int, default=None, help="KV cache size in bytes")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="fraction of GPU memory for weights, activations and KV cache")
    g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--seed", type=int, default=0)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(
        model=args.model, served_model_name=args.served_model_name, dtype=args.dtype, device=args.device,
        block_size=args.block_size, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, kv_cache_memory=args.kv_cache_memory,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill, seed=args.seed)
