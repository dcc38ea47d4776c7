"""The C++ LoRA kernel (kernels/cpu_lora.cpp) equals the token-by-token definition, float32 and
bfloat16, with the same tolerances as the other paths (test_lora_ops.py), and refuses runs that
fall outside the batch or the slots."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import cpu_elementwise, cpu_kernels
from argosy.kernels.lora_ops import LoRABatch, lora_reference
from tests.kernels.test_lora_ops import BOUNDS, IDS, mixed_step, random_stack

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bounds", [*BOUNDS, (0, 100, 150, 200)], ids=[*IDS, "wide"])
def test_the_cpu_kernel_equals_the_definition(bounds, dtype):
    if cpu_kernels.cpu_kernels() is None:
        pytest.skip("no C++ compiler: the PyTorch path runs")
    fan_in, rank = 200, 8
    stack = random_stack(4, rank, fan_in, bounds, dtype)
    host, x, expected = mixed_step(fan_in, bounds[-1], dtype)
    token_slots = torch.tensor(host.lora_slots)
    out = expected.clone()
    lora_reference(x, expected, token_slots, stack)
    cpu_elementwise.lora(x, out, LoRABatch(token_slots, host.lora_runs), stack)
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2**-7}[dtype]
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())
    base = token_slots < 0
    assert torch.equal(out[base], mixed_step(fan_in, bounds[-1], dtype)[2][base])  # base tokens untouched


def test_the_cpu_kernel_refuses_a_run_outside_the_batch():
    if cpu_kernels.cpu_kernels() is None:
        pytest.skip("no C++ compiler")
    stack = random_stack(2, 4, 8, (0, 8))
    x, out = torch.zeros(3, 8), torch.zeros(3, 8)
    for runs, words in (([(0, 0, 4)], "tokens out of range"), ([(2, 0, 1)], "slot out of range")):
        with pytest.raises(RuntimeError, match=words):
            cpu_kernels.cpu_kernels().lora_runs(x, out, stack.a, stack.b, [0, 8], torch.tensor(runs))
