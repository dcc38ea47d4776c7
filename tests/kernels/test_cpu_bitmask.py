"""The C++ grammar-mask kernel bans exactly what the grammar library's own application bans."""

from __future__ import annotations

import pytest
import torch

from argosy.kernels import cpu_kernels

# The grammar library is the reference; the GPU machine, which runs tests/kernels, has none.
xgr = pytest.importorskip("xgrammar", reason="xgrammar (and pydantic) are not installed", exc_type=ImportError)

# Host tensors, even where CUDA is present; each instruction-set level this CPU runs.
pytestmark = [pytest.mark.cpu_kernels, pytest.mark.usefixtures("each_cpu_level")]


@pytest.mark.parametrize("vocab", [32, 1000, 49152])
def test_the_kernel_bans_what_the_library_bans(vocab):
    assert cpu_kernels.cpu_kernels() is not None, "the kernels must build where the tests run"
    g = torch.Generator().manual_seed(vocab)
    words = -(-vocab // 32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (6, words), dtype=torch.int32, generator=g)
    bitmask[1] = -1  # every token allowed
    bitmask[2] = 0  # none
    bitmask[3, : words // 2] = 0
    bitmask[4, words // 2 :] = -1
    logits = torch.randn(6, vocab, generator=g)
    rows = [0, 2, 3, 4]  # row 5 is not constrained: untouched
    expected, got = logits.clone(), logits.clone()
    xgr.apply_token_bitmask_inplace(expected, bitmask, indices=rows)
    cpu_kernels.apply_token_bitmask(got, bitmask, rows)
    assert torch.equal(got, expected)
    assert torch.equal(got[5], logits[5]) and torch.isinf(got[2]).all()


def test_rows_out_of_range_are_refused():
    logits, bitmask = torch.zeros(2, 64), torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="out of range"):
        cpu_kernels.apply_token_bitmask(logits, bitmask, [2])
