"""One rank of test_sharded_model.py's split model, as a process of its own:
`python -P tests/server/parallel/sharded_rank.py RANK SIZE CHECKPOINT PORT OUT` writes the rank's
logits and weight bytes to OUT (torch.save). Run by its path, it imports argosy alone: nothing
of the checkout joins its sys.path. The test reads `run_steps` from here for the whole model's
reference, so both sides step alike."""

from __future__ import annotations

import sys

import torch

from argosy.kernels.attention_backend import select_backend
from argosy.server.models.loader import load_model
from argosy.server.models.model_config import ModelConfig
from argosy.server.parallel.group import join_group
from argosy.server.worker.startup_report import tensor_bytes
from argosy.server.worker.step_inputs import SequenceChunk, prepare_inputs

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


def main(rank: int, size: int, path: str, port: int, out: str) -> None:
    torch.set_num_threads(1)
    shards = join_group(rank, size, ("127.0.0.1", port), torch.device("cpu"))
    logits, weight_bytes = run_steps(ModelConfig.from_folder(path), shards)
    torch.save({"logits": logits, "weight_bytes": weight_bytes}, out)


if __name__ == "__main__":
    rank, size, path, port, out = sys.argv[1:]
    main(int(rank), int(size), path, int(port), out)
