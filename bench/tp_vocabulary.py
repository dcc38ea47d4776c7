"""Tensor parallelism's embedding and LM head: held whole on every rank, or split by vocabulary
rows (the last rank's padded), side by side in one run on the same ranks (gloo processes, as the
engine starts them on a CPU host). Split, a step's embeddings need one all-reduce and its logits
a gather to rank 0; whole, each rank reads the whole table. Printed: each rank's bytes for the
two, and rank 0's time for the embedding and the logits of a step (timed from a barrier, so the
collectives' waits count), for decode and prefill shapes; the head is the embeddings' tied copy
in the format the engine gives it (oneDNN-packed on CPUs that pack bfloat16).

    python bench/tp_vocabulary.py [--model PATH] [--ranks 3] [--steps 32]
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch
import torch.multiprocessing as mp
from torch import nn

from argosy.server.models.checkpoint import stored_tensors
from argosy.server.models.default_model import resolve_model_path
from argosy.server.models.linear_factory import LinearFactory
from argosy.server.models.model_config import ModelConfig
from argosy.server.models.tensor_reader import TensorRead, read_tensors
from argosy.server.parallel.group import free_port, join_group

CPU = torch.device("cpu")
# (name, tokens embedded, rows of logits): one step each.
SHAPES = [("decode, 1 seq", 1, 1), ("decode, 16 seqs", 16, 16), ("prefill, 512 tokens", 512, 1),
          ("prefill, 16 x 512 tokens", 8192, 16)]  # fmt: skip


def head_of(embeddings: torch.Tensor, dtype: torch.dtype):
    """The tied head as the engine builds it: a layer of its own where the format wants one."""
    head = LinearFactory.for_device(None, CPU, dtype).tied_head(embeddings)
    return head if head is not None else (lambda hidden: nn.functional.linear(hidden, embeddings))


def rank_main(rank: int, size: int, path: str, port: int, steps: int, results) -> None:
    torch.set_num_threads(1)
    try:
        cfg = ModelConfig.from_folder(path)
        shards = join_group(rank, size, ("127.0.0.1", port), CPU)
        [stored] = [t for t in stored_tensors(path) if t.name.endswith("embed_tokens.weight")]
        whole = torch.empty(stored.shape, dtype=torch.bfloat16)
        read_tensors([TensorRead(stored, whole)])
        start, length = shards.layout.vocab_part(cfg)
        mine = torch.zeros(shards.layout.vocab_rows(cfg), cfg.hidden_size, dtype=torch.bfloat16)
        mine[:length] = whole[start : start + length]
        vocab = shards.vocab(cfg)
        ways = {
            "whole": (nn.Embedding.from_pretrained(whole), head_of(whole, whole.dtype), None),
            "split": (nn.Embedding.from_pretrained(mine), head_of(mine, mine.dtype), vocab),
        }
        generator = torch.Generator().manual_seed(0)  # the same inputs on every rank
        times: dict[tuple[str, str], float] = {}
        with torch.inference_mode():
            for shape, tokens, rows in SHAPES:
                ids = torch.randint(0, cfg.vocab_size, (tokens,), generator=generator)
                hidden = torch.randn(rows, cfg.hidden_size, generator=generator).to(torch.bfloat16)
                for way, (embedding, head, split) in ways.items():
                    repeats = steps if tokens <= 16 else max(2, steps // 8)
                    shards.min_over_ranks(0)  # a barrier: every rank starts together
                    begin = time.perf_counter()
                    for _ in range(repeats):
                        if split is None:
                            embedding(ids), head(hidden)
                        else:
                            split.embed(embedding, ids), split.logits(head(hidden))
                    times[shape, way] = (time.perf_counter() - begin) / repeats
        sizes = {way: sum(t.nbytes for t in (e.weight, *_head_tensors(h))) for way, (e, h, _) in ways.items()}
        results.put((rank, times, sizes))
    except BaseException:
        results.put((rank, traceback.format_exc(), None))


def _head_tensors(head) -> list[torch.Tensor]:
    return list(head.buffers()) + list(head.parameters()) if isinstance(head, nn.Module) else []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint folder; default: the embedded model")
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--steps", type=int, default=32, help="repeats per decode figure (prefill: an eighth)")
    args = parser.parse_args()
    path = str(resolve_model_path(args.model))
    ctx = mp.get_context("spawn")
    results, port = ctx.Queue(), free_port()
    procs = [
        ctx.Process(target=rank_main, args=(rank, args.ranks, path, port, args.steps, results))
        for rank in range(args.ranks)
    ]
    for proc in procs:
        proc.start()
    found = {rank: (times, sizes) for rank, times, sizes in (results.get(timeout=1800) for _ in procs)}
    for proc in procs:
        proc.join()
    failed = [f"rank {rank}:\n{times}" for rank, (times, _) in found.items() if isinstance(times, str)]
    if failed:
        raise SystemExit("\n".join(failed))
    times, sizes = found[0]
    print(f"\n{path}; {args.ranks} ranks; bfloat16; rank 0's time per step, embedding and logits")
    whole, split = (sizes[way] / 2**20 for way in ("whole", "split"))
    print(f"embedding + head per rank: whole {whole:.0f} MiB, split {split:.0f} MiB\n")
    print("| step | whole | split (with all-reduce and gather) | split / whole |")
    print("|---|--:|--:|--:|")
    for shape, _, _ in SHAPES:
        whole, split = times[shape, "whole"], times[shape, "split"]
        print(f"| {shape} | {whole * 1e3:.2f} ms | {split * 1e3:.2f} ms | {split / whole:.2f}x |")


if __name__ == "__main__":
    main()
