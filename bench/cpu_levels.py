"""The engine's decode speed at each instruction-set level this CPU runs, with bfloat16, float32
and int8 weights (--quantization int8, bfloat16 activations), side by side in one run: the
default model, offline, one sequence and sixteen. Each level runs in a process of its own that
stands in for a CPU of that level: ARGOSY_CPU_ISA picks Argosy's kernels, and
ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA and MKL_ENABLE_INSTRUCTIONS hold PyTorch's own kernels,
oneDNN and MKL to the same instructions (an AVX2 machine's bandwidth and cores are not emulated:
the figures compare levels and weight formats on this machine). `--steps one-call eager` sets
each step's decoder layers in one C++ call (the default) beside the modules (`--enforce-eager`).

    python bench/cpu_levels.py [--levels avx2 avx512_bf16] [--weights bfloat16 int8] [--tokens 64]
                               [--steps one-call eager]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

# What PyTorch's own dispatch, oneDNN and MKL are held to, per level.
PYTORCH_LIMITS = {
    "portable": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "avx512": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
    "avx512_bf16": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
}


# The engine's dtype and quantization for each weight format measured.
WEIGHTS = {"bfloat16": ("bfloat16", None), "float32": ("float32", None), "int8": ("bfloat16", "int8")}


STEPS = {"one-call": False, "eager": True}  # --steps: each one's enforce_eager


def measure(weights: str, steps: str, tokens: int) -> dict:
    """In the child: the engine's start-up line and its decode tokens/s at 1 and 16 sequences."""
    from argosy import LLM, SamplingParams

    dtype, quantization = WEIGHTS[weights]
    llm = LLM(
        dtype=dtype,
        quantization=quantization,
        enforce_eager=STEPS[steps],
        max_model_len=1024,
        kv_cache_memory=256 << 20,
        max_num_seqs=16,
    )
    prompts = [f"Question {i}: tell me about the history of the number {i}." for i in range(16)]
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    figures = {"startup": llm.engine.core.device.startup.split(":")[0]}
    for batch in (1, 16):
        start = time.perf_counter()
        outputs = llm.generate(prompts[:batch], params)
        figures[f"tok_s_{batch}"] = sum(len(o.outputs[0].token_ids) for o in outputs) / (time.perf_counter() - start)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", nargs="+", default=None, help="default: every level this CPU runs")
    parser.add_argument("--weights", nargs="+", choices=list(WEIGHTS), default=list(WEIGHTS))
    parser.add_argument("--tokens", type=int, default=64, help="tokens per sequence")
    parser.add_argument("--steps", nargs="+", choices=list(STEPS), default=["one-call"])
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child, args.tokens)))
        return
    from argosy.kernels.cpu_isa import ISA_ENV, machine_levels
    from argosy.server.profile.machine import cpu_line

    rows = []
    for level in args.levels or machine_levels():
        for weights in args.weights:
            for steps in args.steps:
                env = {**os.environ, ISA_ENV: level, **PYTORCH_LIMITS[level]}
                command = [sys.executable, "-P", __file__, "--child", weights, steps, "--tokens", str(args.tokens)]
                done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                rows.append((level, weights, steps, json.loads(done.stdout.strip().splitlines()[-1])))
    print(f"\n{cpu_line()}; the default model, offline, {args.tokens} tokens a sequence, greedy")
    print("| level | weights | layers | decode tok/s, 1 seq | decode tok/s, 16 seqs | start-up line |")
    print("|---|---|---|--:|--:|---|")
    for level, weights, steps, figures in rows:
        tok_s = f"{figures['tok_s_1']:.1f} | {figures['tok_s_16']:.1f}"
        print(f"| {level} | {weights} | {steps} | {tok_s} | `{figures['startup']}` |")


if __name__ == "__main__":
    main()
