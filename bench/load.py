"""Checkpoint loading against the disk: for each checkpoint, the raw sequential read of its
safetensors files (one reader, 16 MiB reads), the copy of every tensor out of safetensors'
memory map (how loading went before), the engine's parallel reader alone, and the engine's
load of the same files into the model (the CPU device, bfloat16: build the model, read,
convert), side by side, from a cold page cache (each
file dropped with posix_fadvise after an fsync) and from a warm one; then the time from
`argosy serve` to a healthy server, by phase, cold and warm.

    python bench/load.py [--model PATH ...] [--generated-gb 2] [--repeats 3] [--folder DIR]

The generated checkpoint is a Llama shape in bfloat16, written once into --folder (default: a
temporary folder, removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from argosy.kernels.attention_backend import select_backend
from argosy.server.models.checkpoint import find_shards, stored_tensors
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import TensorRead, read_tensors
from argosy.server.parallel.group import free_port

CPU = torch.device("cpu")
READ_BYTES = 16 << 20


def drop_page_cache(files: list[Path]) -> None:
    """The files' pages out of the page cache (written pages first reach the disk)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(files: list[Path]) -> int:
    """Reads every byte once, sequentially; returns how many."""
    buffer = memoryview(bytearray(READ_BYTES))
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while count := f.readinto(buffer):
                total += count
    return total


def generate_checkpoint(folder: Path, gigabytes: float) -> Path:
    """A random Llama-shaped bfloat16 checkpoint of about `gigabytes`, in 1 GB shards, with the
    default model's tokenizer (so that `argosy serve` takes it)."""
    hidden, inter, heads, kv_heads, vocab = 2048, 5632, 16, 4, 49152
    head_dim = hidden // heads
    per_layer = 2 * (hidden * hidden + hidden * kv_heads * head_dim) + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((gigabytes * 1e9 / 2 - 2 * vocab * hidden) / per_layer))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve_model_path(None) / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config))
    generator = torch.Generator().manual_seed(0)

    def weight(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": weight(vocab, hidden), "lm_head.weight": weight(vocab, hidden)}
    tensors["model.norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    shards: list[dict[str, torch.Tensor]] = [{}]
    for i in range(layers):
        prefix = f"model.layers.{i}."
        layer = {
            "self_attn.q_proj.weight": weight(hidden, hidden),
            "self_attn.k_proj.weight": weight(kv_heads * head_dim, hidden),
            "self_attn.v_proj.weight": weight(kv_heads * head_dim, hidden),
            "self_attn.o_proj.weight": weight(hidden, hidden),
            "mlp.gate_proj.weight": weight(inter, hidden),
            "mlp.up_proj.weight": weight(inter, hidden),
            "mlp.down_proj.weight": weight(hidden, inter),
            "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
        }
        if sum(t.nbytes for t in shards[-1].values()) > 1e9:
            shards.append({})
        shards[-1].update({prefix + name: t for name, t in layer.items()})
    shards[-1].update(tensors)
    weight_map = {}
    for index, shard in enumerate(shards):
        name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, folder / name, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return folder


def mmap_copy(files: list[Path]) -> list[torch.Tensor]:
    """The way loading went before: each tensor copied out of safetensors' memory map into a
    bfloat16 tensor of its own (every page a fault), all of them kept, as a model keeps them."""
    kept = []
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                kept.append(torch.empty(f.get_slice(name).get_shape(), dtype=torch.bfloat16))
                kept[-1].copy_(f.get_tensor(name))
    return kept


def parallel_read(path: Path) -> list[torch.Tensor]:
    """The engine's reader alone, into bfloat16 tensors of their own, all kept."""
    stored = stored_tensors(path)
    kept = [torch.empty(t.shape, dtype=torch.bfloat16) for t in stored]
    read_tensors([TensorRead(t, dest) for t, dest in zip(stored, kept)])
    return kept


def load_model_once(path: Path) -> None:
    """The engine's load into the model (plain layers: the CPU's packed formats are a step of
    their own after the load, timed by `argosy serve`'s phases below)."""
    cfg = ModelConfig.from_folder(path)
    load_model(cfg, torch.bfloat16, CPU, 2048, select_backend("torch", CPU, cfg.num_kv_heads))


def measure(path: Path, repeats: int) -> list[tuple[str, int, float, float, float, float]]:
    """(page cache, bytes, then seconds of: the raw read, the memory-map copy, the parallel
    read, the load): medians of `repeats` runs, the four interleaved, each first in turn."""
    files = list(find_shards(path))
    rows = []
    for cache in ("cold", "warm"):
        times: dict[str, list[float]] = {"raw": [], "mmap": [], "read": [], "load": []}
        size = 0
        ways = list(times)
        for repeat in range(repeats):  # each way first in turn: a host's own cache favours what follows a read
            for way in ways[repeat % len(ways) :] + ways[: repeat % len(ways)]:
                if cache == "cold":
                    drop_page_cache(files)
                start = time.perf_counter()
                if way == "raw":
                    size = raw_read(files)
                elif way == "mmap":
                    mmap_copy(files)
                elif way == "read":
                    parallel_read(path)
                else:
                    load_model_once(path)
                times[way].append(time.perf_counter() - start)
        rows.append((cache, size, *(statistics.median(t) for t in times.values())))
    return rows


def serve_phases(path: Path) -> str:
    """`argosy serve` on the checkpoint until /health answers 200: when the API listened, the
    engine's start-up phases (its log line), and the total."""
    port = free_port()
    command = [sys.executable, "-P", "-m", "argosy", "serve", "--model", str(path), "--port", str(port)]
    command += ["--kv-cache-memory", str(256 << 20), "--max-model-len", "2048"]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    listening, phases = None, "?"
    try:
        for line in proc.stdout:
            message = json.loads(line).get("message", "") if line.startswith("{") else line
            if "Uvicorn running" in message:
                listening = time.perf_counter() - start
            elif "engine ready" in message:
                phases = message.split("; ")[-1].strip()
            elif " loaded: " in message:
                break
        else:
            raise RuntimeError(f"argosy serve exited {proc.wait()} before it was healthy")
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.05)
        return f"healthy in {time.perf_counter() - start:.2f}s; API listening at {listening:.2f}s; engine: {phases}"
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", action="append", default=None, help="checkpoint folders; default: the embedded model"
    )
    parser.add_argument("--generated-gb", type=float, default=2.0, help="size of the generated checkpoint (0: none)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder", type=Path, default=None, help="where to write the generated checkpoint")
    parser.add_argument("--no-serve", action="store_true", help="skip the argosy serve timings")
    args = parser.parse_args()
    paths = [resolve_model_path(m) for m in (args.model or [None])]
    scratch = None
    if args.generated_gb > 0:
        scratch = args.folder or Path(tempfile.mkdtemp(prefix="argosy-load-"))
        generated = scratch / f"llama-{args.generated_gb:g}gb"
        if not (generated / "model.safetensors.index.json").is_file():
            generate_checkpoint(generated, args.generated_gb)
        paths.append(generated)
    try:
        print("\n| checkpoint | page cache | GB | GB/s: raw read | memory-map copy | parallel read | load "
              "| load / raw |")  # fmt: skip
        print("|---|---|--:|--:|--:|--:|--:|--:|")
        for path in paths:
            for cache, size, raw, mmap, read, load in measure(path, args.repeats):
                rates = " | ".join(f"{size / seconds / 1e9:.2f}" for seconds in (raw, mmap, read, load))
                print(f"| {path.name} | {cache} | {size / 1e9:.2f} | {rates} | {raw / load:.2f}x |", flush=True)
        if not args.no_serve:
            print()
            for path in paths:
                for cache in ("cold", "warm"):
                    if cache == "cold":
                        drop_page_cache(list(find_shards(path)))
                    print(f"{path.name}, {cache}: {serve_phases(path)}", flush=True)
    finally:
        if scratch is not None and args.folder is None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
