"""Host time to build a decode step's inputs at long contexts: the CUDA graphs' static buffers
(StaticInputs.fill) and an eager step's tensors (prepare_inputs, the Triton backend's metadata),
from sequences whose block tables the device already holds (BlockTables). What it leaves: the
per-token and per-sequence fields, built from lists, and one gather of the tables' rows, which
here on CPU is a memory copy of every row (on a GPU a device kernel, off the host).

    python bench/step_inputs.py [--batches 64 256] [--contexts 1024 8192 32768] [--repeats 9]
"""

from __future__ import annotations

import argparse
import time

import torch

from argosy.kernels.interpreter import use_interpreter_without_cuda

use_interpreter_without_cuda()  # the Triton backend's metadata, without launching a kernel

from argosy.kernels.triton_backend import TritonAttention  # noqa: E402
from argosy.server.worker.block_tables import BlockTables  # noqa: E402
from argosy.server.worker.step_inputs import SequenceChunk, StaticInputs, host_inputs, prepare_inputs  # noqa: E402

BLOCK_SIZE = 16


def best_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def row(batch: int, context: int, device: torch.device, backend: TritonAttention, repeats: int) -> tuple[float, float]:
    """Milliseconds to build the graph inputs and the eager inputs of `batch` decodes."""
    blocks = context // BLOCK_SIZE
    lists = [list(range(i * blocks, (i + 1) * blocks)) for i in range(batch)]
    tables = BlockTables.of(lists, device)
    chunks = [SequenceChunk([5], context - 1, table, True, table_row) for table_row, table in enumerate(lists)]
    static = StaticInputs(batch, blocks, BLOCK_SIZE, device)

    def synced(build):
        def run():
            build()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return run

    graph = synced(lambda: static.fill(host_inputs(chunks, BLOCK_SIZE), tables, batch))
    eager = synced(lambda: prepare_inputs(chunks, BLOCK_SIZE, device, backend, tables))
    return best_seconds(graph, repeats) * 1e3, best_seconds(eager, repeats) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backend = TritonAttention(device, num_kv_heads=8)
    print(f"\nhost time to build a decode step's inputs, {device}, block size {BLOCK_SIZE}, best of {args.repeats}")
    print("| batch | context | graph inputs ms | eager inputs ms |\n|--:|--:|--:|--:|")
    for batch in args.batches:
        for context in args.contexts:
            graph_ms, eager_ms = row(batch, context, device, backend, args.repeats)
            print(f"| {batch} | {context} | {graph_ms:.2f} | {eager_ms:.2f} |")


if __name__ == "__main__":
    main()
