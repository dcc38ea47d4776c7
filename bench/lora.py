"""LoRA serving and live weight updates, measured side by side in one run.

    python bench/lora.py [--model PATH] [--num-requests 32] [--max-tokens 64] [--repeats 3] [--no-server]

Throughput: one workload (--num-requests prompts of 64 tokens, --max-tokens output tokens each,
greedy, every request to its full length) served by the base model with LoRA off; by the base
model with LoRA on but no adapter used; with one adapter for every request; and with 8 distinct
adapters spread over the requests, so that every step mixes all 8 (ranks 8, 16 and 64, every
module adapted). Output tokens/s, best of --repeats, the configurations taken in turn each
repeat, and the ratio to LoRA off. The adapters are random PEFT folders of the model's shapes.

Then: the time to load an adapter (read into host memory, copied into a device slot), and the
time of a weight update of the model through a running `argosy serve` against a restart of the
server (the process started until /health answers 200); --no-server leaves that out (the GPU
machine has no HTTP stack)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from argosy import LLM, LoRARequest, SamplingParams
from argosy.server.lora.adapter_folder import MODULES, placement
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.model_config import ModelConfig

KV_CACHE_BYTES = 512 << 20  # per engine: several live at once


def write_adapter(folder: Path, model: ModelConfig, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder adapting every module of every layer, random and non-zero."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model.num_layers):
        for module, (_, _, fan_in, fan_out) in placement(model).items():
            part = "self_attn" if module in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            key = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=g) / fan_in**0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=g) * 0.01
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(MODULES)}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


def workload(vocab: int, count: int) -> list[list[int]]:
    return [[(1000 + 37 * i + 11 * j) % vocab for j in range(64)] for i in range(count)]


def throughput(llm: LLM, prompts: list[list[int]], max_tokens: int, loras: list | None) -> float:
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=loras)
    return len(prompts) * max_tokens / (time.perf_counter() - start)


def serving_rows(model: str, root: Path, args) -> list[tuple[str, float]]:
    config = ModelConfig.from_folder(model)
    prompts = workload(config.vocab_size, args.num_requests)
    engine = dict(dtype=args.dtype, kv_cache_memory=KV_CACHE_BYTES, max_num_seqs=args.max_num_seqs)
    runs: dict[str, tuple[LLM, list | None]] = {
        "base, LoRA off": (LLM(model, **engine), None),
        "base, LoRA on, no adapter used": (LLM(model, enable_lora=True, max_loras=8, **engine), None),
    }
    one = write_adapter(root / "one", config, 16, seed=100)
    runs["1 adapter, rank 16, every request"] = (
        LLM(model, enable_lora=True, max_lora_rank=16, **engine),
        [LoRARequest("one", 1, str(one))] * len(prompts),
    )
    for rank in (8, 16, 64):
        adapters = [
            LoRARequest(f"r{rank}-{i}", i + 1, str(write_adapter(root / f"r{rank}-{i}", config, rank, seed=i)))
            for i in range(8)
        ]
        runs[f"8 adapters, rank {rank}, mixed in every step"] = (
            LLM(model, enable_lora=True, max_loras=8, max_lora_rank=rank, **engine),
            [adapters[i % 8] for i in range(len(prompts))],
        )
    for llm, loras in runs.values():  # warm: kernels built, adapters in their slots
        throughput(llm, prompts[:8], 4, loras and loras[:8])
    best = dict.fromkeys(runs, 0.0)
    for _ in range(args.repeats):
        for name, (llm, loras) in runs.items():
            best[name] = max(best[name], throughput(llm, prompts, args.max_tokens, loras))
    return list(best.items())


def load_times(model: str, root: Path, args) -> list[tuple[str, float]]:
    from argosy.server.lora.device_weights import LoRAWeights
    from argosy.server.lora.peft_adapter import read_adapter

    config = ModelConfig.from_folder(model)
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for rank in (16, 64):
        folder = write_adapter(root / f"load-{rank}", config, rank, seed=7)
        slots = LoRAWeights(config, 1, rank, dtype, device)
        read, copy = [], []
        for _ in range(args.repeats):
            start = time.perf_counter()
            adapter = read_adapter("a", folder, config, rank, dtype)
            read.append(time.perf_counter() - start)
            start = time.perf_counter()
            slots.load(0, adapter)
            if device.type == "cuda":
                torch.cuda.synchronize()
            copy.append(time.perf_counter() - start)
        rows.append((f"rank {rank}: read into host memory", min(read) * 1e3))
        rows.append((f"rank {rank}: copied into a device slot", min(copy) * 1e3))
    return rows


def update_against_restart(model: str, root: Path, args) -> list[tuple[str, float]]:
    import httpx

    port = 8931
    trained = shutil.copytree(model, root / "trained")
    command = [sys.executable, "-P", "-m", "argosy", "serve", "--model", model, "--port", str(port), "--dtype"]
    command += [args.dtype, "--kv-cache-memory", str(KV_CACHE_BYTES), "--enable-weight-updates", "--log-format", "text"]
    url = f"http://127.0.0.1:{port}"
    restart = update = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while True:
                try:
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
            restart = min(restart, time.perf_counter() - start)
            start = time.perf_counter()
            answer = httpx.post(f"{url}/v1/update_weights_from_disk", json={"model_path": str(trained)}, timeout=600)
            answer.raise_for_status()
            update = min(update, time.perf_counter() - start)
        finally:
            server.terminate()
            server.wait(60)
    return [("restart of argosy serve (start to healthy)", restart), ("weight update while serving", update)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder; default: the embedded default model")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--no-server", action="store_true", help="leave out the update against a restart")
    parser.add_argument("--max-num-seqs", type=int, default=256, help="of each engine (fewer CUDA graphs to capture)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = str(resolve_model_path(args.model))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rows = serving_rows(model, root, args)
        base = rows[0][1]
        workload_name = f"{args.num_requests} requests x {args.max_tokens} output tokens"
        print(f"| {workload_name} | output tokens/s | vs LoRA off |")
        print("|---|--:|--:|")
        for name, value in rows:
            print(f"| {name} | {value:.1f} | {value / base:.2f}x |")
        print("\n| adapter load | ms |\n|---|--:|")
        for name, ms in load_times(model, root, args):
            print(f"| {name} | {ms:.1f} |")
        if not args.no_server:
            print("\n| new weights for a running model | seconds |\n|---|--:|")
            for name, seconds in update_against_restart(model, root, args):
                print(f"| {name} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
