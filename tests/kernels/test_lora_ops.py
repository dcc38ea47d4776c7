"""The LoRA products a run of tokens at a time equal the token-by-token definition, whatever
mix of slots, ranks padded with zeros, slices and base tokens a step holds."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.lora_ops import LoRABatch, LoRAStack, lora_reference, lora_runs
from argosy.server.worker.step_inputs import SequenceChunk, host_inputs


def random_stack(slots: int, rank: int, fan_in: int, bounds: tuple[int, ...], dtype=torch.float32) -> LoRAStack:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(slots, (len(bounds) - 1) * rank, fan_in, generator=g).to(dtype)
    b = torch.randn(slots, bounds[-1], rank, generator=g).to(dtype) * 0.1
    return LoRAStack(a, b, bounds)


@pytest.mark.parametrize("bounds", [(0, 48), (0, 32, 40, 48), (0, 24, 48)], ids=["one", "qkv", "gate-up"])
def test_runs_equal_the_definition(bounds):
    stack = random_stack(4, 8, 40, bounds)
    slots_per_chunk = [2, -1, 0, 2, 3, -1, 1]
    lengths = [1, 3, 5, 1, 2, 1, 4]
    chunks = [SequenceChunk([0] * n, 0, [0], sample=True, lora_slot=slot) for n, slot in zip(lengths, slots_per_chunk)]
    host = host_inputs(chunks, block_size=16)
    assert host.lora_runs == [(2, 0, 1), (0, 4, 9), (2, 9, 10), (3, 10, 12), (1, 13, 17)]
    x = torch.randn(sum(lengths), 40)
    token_slots = torch.tensor(host.lora_slots)
    expected, out = torch.randn(sum(lengths), bounds[-1]), None
    out = expected.clone()
    lora_reference(x, expected, token_slots, stack)
    lora_runs(x, out, LoRABatch(token_slots, host.lora_runs), stack)
    torch.testing.assert_close(out, expected)
    base = token_slots < 0
    assert not torch.equal(out[~base], x[~base] @ torch.zeros(40, bounds[-1]))  # something was added


def test_consecutive_chunks_of_one_adapter_make_one_run():
    chunks = [SequenceChunk([0] * n, 0, [0], sample=True, lora_slot=1) for n in (2, 1, 3)]
    assert host_inputs(chunks, block_size=16).lora_runs == [(1, 0, 6)]
