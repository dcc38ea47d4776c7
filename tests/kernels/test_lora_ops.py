"""The LoRA products a run of tokens at a time (the CPU path) and token by token in Triton (the
GPU's, in the interpreter here) equal the token-by-token definition, whatever mix of slots,
slices and base tokens a step holds. Tolerances: float32 1e-5 (the order of accumulation
differs); bfloat16 one ulp of the output (2^-7 relative), which is rounded once from float32."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.lora_ops import LoRABatch, LoRAStack, lora_reference, lora_runs
from argosy.server.worker.step_inputs import SequenceChunk, host_inputs

BOUNDS = [(0, 48), (0, 32, 40, 48), (0, 24, 48)]
IDS = ["one", "qkv", "gate-up"]


def random_stack(slots: int, rank: int, fan_in: int, bounds: tuple[int, ...], dtype=torch.float32) -> LoRAStack:
    g = torch.Generator().manual_seed(0)
    a = torch.randn(slots, (len(bounds) - 1) * rank, fan_in, generator=g).to(dtype)
    b = (torch.randn(slots, bounds[-1], rank, generator=g) * 0.1).to(dtype)
    return LoRAStack(a, b, bounds)


def mixed_step(fan_in: int, out_rows: int, dtype: torch.dtype):
    """Tokens of four slots and the base, in runs of 1 to 5: their host inputs, x and an output."""
    slots_per_chunk = [2, -1, 0, 2, 3, -1, 1]
    lengths = [1, 3, 5, 1, 2, 1, 4]
    chunks = [SequenceChunk([0] * n, 0, [0], True, lora_slot=slot) for n, slot in zip(lengths, slots_per_chunk)]
    host = host_inputs(chunks, block_size=16)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sum(lengths), fan_in, generator=g).to(dtype)
    out = torch.randn(sum(lengths), out_rows, generator=g).to(dtype)
    return host, x, out


@pytest.mark.parametrize("bounds", BOUNDS, ids=IDS)
def test_runs_equal_the_definition(bounds):
    stack = random_stack(4, 8, 40, bounds)
    host, x, expected = mixed_step(40, bounds[-1], torch.float32)
    assert host.lora_runs == [(2, 0, 1), (0, 4, 9), (2, 9, 10), (3, 10, 12), (1, 13, 17)]
    token_slots = torch.tensor(host.lora_slots)
    out, before = expected.clone(), expected.clone()
    lora_reference(x, expected, token_slots, stack)
    lora_runs(x, out, LoRABatch(token_slots, host.lora_runs), stack)
    torch.testing.assert_close(out, expected)
    base = token_slots < 0
    assert torch.equal(out[base], before[base]) and not torch.allclose(out[~base], before[~base])


def test_consecutive_chunks_of_one_adapter_make_one_run():
    chunks = [SequenceChunk([0] * n, 0, [0], True, lora_slot=1) for n in (2, 1, 3)]
    assert host_inputs(chunks, block_size=16).lora_runs == [(1, 0, 6)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bounds", [*BOUNDS, (0, 100, 150, 200)], ids=[*IDS, "wide"])
def test_the_triton_kernels_equal_the_definition(bounds, dtype):
    from argosy.kernels import triton_lora

    fan_in, rank = 200, 8  # more input features than one program's block; rows over several programs
    stack = random_stack(4, rank, fan_in, bounds, dtype)
    host, x, expected = mixed_step(fan_in, bounds[-1], dtype)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    token_slots = torch.tensor(host.lora_slots)
    out = expected.clone().to(device)
    lora_reference(x, expected, token_slots, stack)
    stack_there = LoRAStack(stack.a.to(device), stack.b.to(device), stack.bounds)
    triton_lora.lora(x.to(device), out, LoRABatch(token_slots.to(device), []), stack_there)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2**-7}[dtype]
    torch.testing.assert_close(out.cpu(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())
