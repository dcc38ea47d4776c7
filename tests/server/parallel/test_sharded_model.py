"""One model split across ranks (processes joined by gloo, as on a CPU host): each rank reads only
its slices of the checkpoint, holds 1/N of the weights but for the norms (and KV projections
replicated past their count), and the ranks' forward pass gives the logits of the whole model on
rank 0, through prefill and decode over the paged cache, with the KV heads split (N = 2) and
replicated (N = 4, more ranks than the checkpoint's 2 KV heads), and with a vocabulary the ranks
cannot share equally (the last rank's rows padded)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import SINGLE
from argosy.server.parallel.layout import ShardLayout, check_tensor_parallel
from tests.checkpoints import build_checkpoint
from tests.processes import free_port
from tests.server.parallel.sharded_rank import run_steps

RANK = Path(__file__).with_name("sharded_rank.py")


def run_ranks(path, size: int, tmp_path: Path) -> dict[int, tuple[torch.Tensor, int]]:
    port = free_port()
    outs = [tmp_path / f"rank{rank}.pt" for rank in range(size)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", str(RANK), str(rank), str(size), str(path), str(port), str(out)],
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, out in enumerate(outs)
    ]
    try:
        for rank, proc in enumerate(procs):
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, f"rank {rank} failed:\n{err[-3000:]}"
    finally:
        for proc in procs:
            proc.kill()
    found = {}
    for rank, out in enumerate(outs):
        result = torch.load(out)
        found[rank] = (result["logits"], result["weight_bytes"])
    return found


@pytest.fixture(scope="module")
def odd_vocab_checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("odd-vocab") / "llama", "llama", vocab_size=322)


@pytest.mark.parametrize(
    ("size", "checkpoint"),
    [(2, "llama_checkpoint"), (4, "llama_checkpoint"), (4, "odd_vocab_checkpoint")],
    ids=["kv-split", "kv-replicated", "vocab-padded"],
)
def test_ranks_give_the_whole_models_logits_each_holding_its_share(request, size, checkpoint, tmp_path):
    path = request.getfixturevalue(checkpoint)
    cfg = ModelConfig.from_folder(path)
    whole_logits, whole_bytes = run_steps(cfg, SINGLE)
    ranks = run_ranks(path, size, tmp_path)
    norms = (2 * cfg.num_layers + 1) * cfg.hidden_size
    vocab_whole = 2 * cfg.vocab_size * cfg.hidden_size  # the embedding and the untied head
    kv_whole = 2 * cfg.num_layers * cfg.hidden_size * cfg.num_kv_heads * cfg.head_dim
    layers = whole_bytes // 4 - norms - vocab_whole - kv_whole  # float32 elements split N ways
    rows = -(-cfg.vocab_size // size)
    for rank, (logits, weight_bytes) in ranks.items():
        if rank == 0:  # the others' logits are their own rows only: nothing reads them
            assert logits.shape == whole_logits.shape
            torch.testing.assert_close(logits, whole_logits, rtol=1e-5, atol=1e-5)
        else:
            assert logits.shape == (len(whole_logits), rows)
        local = ShardLayout(rank, size).local_config(cfg)
        kv_local = kv_whole // cfg.num_kv_heads * local.num_kv_heads  # KV projections replicated past 2 ranks
        expected = norms + 2 * rows * cfg.hidden_size + layers // size + kv_local
        assert weight_bytes == 4 * expected, (rank, weight_bytes, 4 * expected)


def test_sizes_the_heads_cannot_be_split_by_are_refused_with_the_numbers(llama_checkpoint):
    cfg = ModelConfig.from_folder(llama_checkpoint)  # 4 heads, 2 KV heads, 128 MLP features
    check_tensor_parallel(cfg, 4)
    with pytest.raises(InvalidRequestError, match="4 attention heads, which 3 ranks") as caught:
        check_tensor_parallel(cfg, 3)
    assert caught.value.param == "tensor_parallel_size"
    with pytest.raises(InvalidRequestError, match="3 KV heads"):
        check_tensor_parallel(dataclasses.replace(cfg, num_heads=12, num_kv_heads=3), 2)
    with pytest.raises(InvalidRequestError, match="MLP has 130 features"):
        check_tensor_parallel(dataclasses.replace(cfg, intermediate_size=130), 4)
