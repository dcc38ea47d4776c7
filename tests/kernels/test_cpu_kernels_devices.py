"""Every CPU kernel refuses a tensor that is not in host memory, with an error that names it,
rather than reading device memory as host memory (a crash). Meta tensors stand for CUDA ones:
no data on the host, and never a CPU device."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels.cpu_kernels import cpu_kernels

pytestmark = pytest.mark.cpu_kernels  # host tensors, even where CUDA is present

META = torch.device("meta")


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device=META)


CALLS = {
    "paged_decode_attention": lambda k: k.paged_decode_attention(
        meta(1, 2, 64),
        meta(4, 16, 1, 64),
        meta(4, 16, 1, 64),
        meta(1, dtype=torch.long),
        meta(1, 2, dtype=torch.long),
        meta(1, dtype=torch.long),
        0.125,
        meta(1, 2, 64),
    ),
    "paged_chunk_attention": lambda k: k.paged_chunk_attention(
        meta(3, 2, 64),
        meta(4, 16, 1, 64),
        meta(4, 16, 1, 64),
        meta(1, dtype=torch.long),
        meta(1, dtype=torch.long),
        meta(1, dtype=torch.long),
        meta(1, 2, dtype=torch.long),
        0.125,
        meta(3, 2, 64),
    ),
    "greedy_argmax": lambda k: k.greedy_argmax(meta(2, 4096)),
    "rms_norm_bf16": lambda k: k.rms_norm_bf16(meta(2, 64), meta(64), 1e-6, meta(2, 64)),
    "rotary_bf16": lambda k: k.rotary_bf16(
        meta(2, dtype=torch.long),
        meta(2, 2, 64),
        meta(2, 1, 64),
        meta(8, 64, dtype=torch.float32),
        meta(8, 64, dtype=torch.float32),
    ),
    "silu_and_mul_bf16": lambda k: k.silu_and_mul_bf16(meta(2, 128)),
    "write_kv": lambda k: k.write_kv(
        meta(2, 1, 64), meta(2, 1, 64), meta(4, 16, 1, 64), meta(4, 16, 1, 64), meta(2, dtype=torch.long)
    ),
    "apply_token_bitmask": lambda k: k.apply_token_bitmask(
        meta(2, 64, dtype=torch.float32), meta(2, 2, dtype=torch.int32), torch.tensor([0])
    ),
    "lora_runs": lambda k: k.lora_runs(
        meta(2, 64), meta(2, 96), meta(2, 48, 64), meta(2, 96, 16), [0, 64, 80, 96], meta(1, 3, dtype=torch.long)
    ),
}


@pytest.mark.parametrize("kernel", sorted(CALLS))
def test_a_kernel_given_a_tensor_off_the_cpu_raises_naming_itself(kernel):
    kernels = cpu_kernels()
    assert kernels is not None, "the kernels must build where the tests run"
    with pytest.raises(RuntimeError, match=f"{kernel} is a CPU kernel: it was given a tensor on meta"):
        CALLS[kernel](kernels)


def test_every_test_of_the_cpu_kernels_keeps_its_tensors_on_the_host():
    """Where CUDA is present the kernel tests build their tensors there (conftest.py), except the
    modules marked cpu_kernels: a CPU kernel's test left unmarked would hand it CUDA tensors."""
    from pathlib import Path

    unmarked = [
        path.name
        for path in sorted(Path(__file__).parent.glob("test_*.py"))
        if ("cpu_kernels" in (text := path.read_text()) or "cpu_elementwise" in text)
        and "pytest.mark.cpu_kernels" not in text
    ]
    assert unmarked == []
