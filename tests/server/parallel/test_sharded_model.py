"""One model split across ranks (processes joined by gloo, as on a CPU host): each rank reads only
its slices of the checkpoint, holds 1/N of the weights but for the norms (and KV projections
replicated past their count), and the ranks' forward pass gives the logits of the whole model on
rank 0, through prefill and decode over the paged cache, with the KV heads split (N = 2) and
replicated (N = 4, more ranks than the checkpoint's 2 KV heads), and with a vocabulary the ranks
cannot share equally (the last rank's rows padded)."""

from __future__ import annotations

import dataclasses
import traceback

import pytest
import torch
import torch.multiprocessing as mp

from argosy.kernels.attention_backend import select_backend
from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import SINGLE, join_group
from argosy.server.parallel.layout import ShardLayout, check_tensor_parallel
from argosy.server.worker.startup_report import tensor_bytes
from argosy.server.worker.step_inputs import SequenceChunk, prepare_inputs
from tests.checkpoints import build_checkpoint
from tests.processes import free_port

BLOCK = 16
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [200, 3], list(range(3, 40))]


def run_steps(cfg: ModelConfig, shards) -> tuple[torch.Tensor, int]:
    """Logits of a prefill of PROMPTS, then of one decode step for each; and the weights' bytes."""
    device = torch.device("cpu")
    backend = select_backend("torch", device, cfg.num_kv_heads)
    model = load_model(cfg, torch.float32, device, 512, backend, shards=shards)
    local = shards.layout.local_config(cfg)
    cache = torch.zeros(cfg.num_layers, 2, 12, BLOCK, local.num_kv_heads, cfg.head_dim)
    tables = [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    logits = []
    with torch.inference_mode():
        prefill = [SequenceChunk(p, 0, t, True) for p, t in zip(PROMPTS, tables)]
        decode = [SequenceChunk([17], len(p), t, True) for p, t in zip(PROMPTS, tables)]
        for chunks in (prefill, decode):
            inputs = prepare_inputs(chunks, BLOCK, device, backend)
            hidden = model(inputs.input_ids, inputs.positions, cache, inputs.attention)
            logits.append(model.compute_logits(hidden[inputs.logits_rows]))
    return torch.cat(logits), tensor_bytes(model)


def rank_main(rank: int, size: int, path: str, port: int, results) -> None:
    torch.set_num_threads(1)
    try:
        cfg = ModelConfig.from_folder(path)
        shards = join_group(rank, size, ("127.0.0.1", port), torch.device("cpu"))
        logits, weight_bytes = run_steps(cfg, shards)
        results.put((rank, logits.tolist(), weight_bytes))  # plain data: the process ends next
    except BaseException:
        results.put((rank, traceback.format_exc(), 0))


def run_ranks(path, size: int) -> dict[int, tuple[torch.Tensor, int]]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, size, str(path), port, results)) for rank in range(size)]
    for proc in procs:
        proc.start()
    found = {}
    for _ in range(size):
        rank, logits, weight_bytes = results.get(timeout=300)
        assert not isinstance(logits, str), f"rank {rank} failed:\n{logits}"
        found[rank] = (torch.tensor(logits), weight_bytes)
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    return found


@pytest.fixture(scope="module")
def odd_vocab_checkpoint(tmp_path_factory):
    return build_checkpoint(tmp_path_factory.mktemp("odd-vocab") / "llama", "llama", vocab_size=322)


@pytest.mark.parametrize(
    ("size", "checkpoint"),
    [(2, "llama_checkpoint"), (4, "llama_checkpoint"), (4, "odd_vocab_checkpoint")],
    ids=["kv-split", "kv-replicated", "vocab-padded"],
)
def test_ranks_give_the_whole_models_logits_each_holding_its_share(request, size, checkpoint):
    path = request.getfixturevalue(checkpoint)
    cfg = ModelConfig.from_folder(path)
    whole_logits, whole_bytes = run_steps(cfg, SINGLE)
    ranks = run_ranks(path, size)
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
