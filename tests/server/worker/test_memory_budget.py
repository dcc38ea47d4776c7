"""Sizing the KV cache: a byte budget on CPU; on GPU what is left of gpu_memory_utilization
after the weights and the largest step's activations, measured by a profiling pass (skipped
when a byte budget is given). The pass is the same code on CPU, where it runs but measures
nothing."""

from __future__ import annotations

import torch

from argosy.server.engine_config import EngineConfig
from argosy.server.worker.memory_budget import CPU_KV_CACHE_BYTES, gpu_kv_budget, kv_cache_budget
from tests.checkpoints import tiny_llm


def test_gpu_budget_leaves_room_for_weights_activations_and_others():
    gib = 1 << 30
    assert (
        gpu_kv_budget(total=80 * gib, others=2 * gib, peak_of_ours=20 * gib, utilization=0.9)
        == int(72 * gib) - 22 * gib
    )
    assert gpu_kv_budget(total=16 * gib, others=0, peak_of_ours=16 * gib, utilization=0.9) == 0


def never_measure() -> int:
    raise AssertionError("a byte budget needs no profiling pass")


def test_a_byte_budget_is_used_as_given_without_profiling():
    assert kv_cache_budget(EngineConfig(), torch.device("cpu"), never_measure) == CPU_KV_CACHE_BYTES
    for device in ("cpu", "cuda"):  # on a GPU too: a configured budget skips the pass
        assert kv_cache_budget(EngineConfig(kv_cache_memory=12345), torch.device(device), never_measure) == 12345


def test_the_profiling_pass_runs_on_cpu_and_measures_nothing(llama_checkpoint):
    llm = tiny_llm(llama_checkpoint, max_num_batched_tokens=300)
    runner = llm.engine.core.executor.worker.runner
    assert runner.profile_peak_bytes(300, 256) is None  # the GPU's pass, on CPU: runs, measures nothing
    assert runner.kv_cache.shape[2] == llm.stats().kv_blocks_total  # its scratch cache left the engine's alone
