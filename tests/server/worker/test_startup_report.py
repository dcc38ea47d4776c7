"""The start-up report: one log line naming the path the engine runs, where its memory went, and
how fast the checkpoint was read."""

from __future__ import annotations

import logging
import re

from tests.checkpoints import tiny_llm


def test_one_line_names_backend_graphs_quantization_memory_and_phases(llama_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="argosy.engine"):
        fp8 = tiny_llm(
            llama_checkpoint,
            device="cpu",
            dtype="bfloat16",
            quantization="fp8",
            cuda_graph_sizes=[1, 2],
            max_num_seqs=4,
        )
    (line,) = [r.getMessage() for r in caplog.records if r.name == "argosy.engine"]
    report = fp8.engine.core.executor.worker.report
    assert line == report.line()
    assert "attention backend torch" in line and "cuda graphs 2 sizes [1, 2]" in line
    assert "quantization fp8" in line and f"KV cache {fp8.stats().kv_blocks_total} blocks" in line
    phases = r"load [\d.]+s \(checkpoint [\d.]+ GB read in [\d.]+s, [\d.]+ GB/s\), profile [\d.]+s, kv_cache [\d.]+s, "
    assert re.search(phases + r"warmup [\d.]+s, graphs [\d.]+s$", line), line
    bf16 = tiny_llm(llama_checkpoint, device="cpu", dtype="bfloat16").engine.core.executor.worker.report
    assert "cuda graphs off" in bf16.line() and "quantization none" in bf16.line()
    # The decoder's linear weights halve; the embedding, LM head and norms stay bf16.
    assert bf16.weight_bytes * 0.5 < report.weight_bytes < bf16.weight_bytes * 0.8
    # The whole cache tensor: with graphs, the sequences' blocks and the null block.
    assert report.kv_cache_bytes == bf16.kv_cache_bytes == 4 << 20
    assert report.kv_blocks == bf16.kv_blocks - 1
