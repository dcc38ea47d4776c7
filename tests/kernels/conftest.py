from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def on_the_gpu_when_there_is_one():
    """Compiled Triton reads only GPU memory: with CUDA present the kernel tests build their
    tensors there (without it, Triton's interpreter runs them on CPU tensors)."""
    if not torch.cuda.is_available():
        yield
        return
    with torch.device("cuda"):
        yield
