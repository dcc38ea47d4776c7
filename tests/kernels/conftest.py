from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def on_the_gpu_when_there_is_one(request):
    """Compiled Triton reads only GPU memory: with CUDA present the tests of the device kernels
    build their tensors there (without it, Triton's interpreter runs them on CPU tensors). The
    tests of the C++ CPU kernels (marked cpu_kernels) keep theirs on the host either way."""
    if not torch.cuda.is_available() or request.node.get_closest_marker("cpu_kernels"):
        yield
        return
    with torch.device("cuda"):
        yield
