"""ShardLayout: what one rank of a tensor-parallel group holds, as pure functions of the model's
shape. Attention heads and the MLP's intermediate features are split across the ranks: q, k, v
and gate, up by their output rows (columns of the product), o and down by their input columns
(rows of the product), which an all-reduce then sums. KV heads are split too, or, with more
ranks than KV heads, each is replicated on the ranks whose query heads read it (as vLLM does).
The embedding and the LM head are split by vocabulary rows (vocab.py); the norms are
replicated."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from argosy.server.exceptions import InvalidRequestError
from argosy.server.models.model_config import ModelConfig

# Checkpoint tensors by how they split: their output rows, or their input columns.
_BY_ROWS = {"q_proj": "q", "k_proj": "kv", "v_proj": "kv", "gate_proj": "mlp", "up_proj": "mlp"}
_BY_COLUMNS = {"o_proj": "q", "down_proj": "mlp"}
_BY_VOCABULARY = {"embed_tokens", "lm_head"}


def check_tensor_parallel(cfg: ModelConfig, size: int) -> None:
    """Refuses, with the numbers, a size (positive: EngineConfig checks that) the model's heads
    or MLP cannot be split by."""
    heads, kv = cfg.num_heads, cfg.num_kv_heads
    why = None
    if heads % size:
        why = f"the model has {heads} attention heads, which {size} ranks cannot share equally"
    elif kv % size and size % kv:
        why = (
            f"the model has {kv} KV heads: {size} ranks can neither share them equally nor each "
            f"replicate one ({size} is not a multiple of {kv})"
        )
    elif cfg.intermediate_size % size:
        why = f"the model's MLP has {cfg.intermediate_size} features, which {size} ranks cannot share equally"
    if why is not None:
        raise InvalidRequestError(why, param="tensor_parallel_size")


@dataclass(frozen=True)
class ShardLayout:
    rank: int
    size: int

    def local_config(self, cfg: ModelConfig) -> ModelConfig:
        """The model as this rank builds it: its share of the heads and of the MLP."""
        return dataclasses.replace(
            cfg,
            num_heads=cfg.num_heads // self.size,
            num_kv_heads=max(1, cfg.num_kv_heads // self.size),
            intermediate_size=cfg.intermediate_size // self.size,
            vocab_size=self.vocab_rows(cfg),
        )

    def vocab_rows(self, cfg: ModelConfig) -> int:
        """Token rows of the embedding and the LM head per rank, the last rank's padded."""
        return -(-cfg.vocab_size // self.size)

    def vocab_part(self, cfg: ModelConfig) -> tuple[int, int]:
        """(first row, rows) of the checkpoint's vocabulary that this rank reads."""
        rows = self.vocab_rows(cfg)
        start = self.rank * rows
        return start, max(0, min(rows, cfg.vocab_size - start))

    def kv_head(self, cfg: ModelConfig) -> int:
        """The first KV head this rank holds (with replication, the one its query heads read)."""
        if cfg.num_kv_heads >= self.size:
            return self.rank * (cfg.num_kv_heads // self.size)
        return self.rank // (self.size // cfg.num_kv_heads)

    def shard(self, name: str, cfg: ModelConfig) -> tuple[int, int, int] | None:
        """(dimension, start, length) of the checkpoint tensor `name` that this rank reads;
        None for a tensor every rank holds whole."""
        if self.size == 1:
            return None
        module = name.split(".")[-2] if name.count(".") else ""
        if module in _BY_VOCABULARY:
            return 0, *self.vocab_part(cfg)
        kind = _BY_ROWS.get(module) or _BY_COLUMNS.get(module)
        if kind is None:
            return None
        dim = 0 if module in _BY_ROWS else 1  # o and down have no bias in these architectures
        local = self.local_config(cfg)
        if kind == "q":
            length = local.num_heads * cfg.head_dim
            return dim, self.rank * length, length
        if kind == "kv":
            length = local.num_kv_heads * cfg.head_dim
            return dim, self.kv_head(cfg) * cfg.head_dim, length
        return dim, self.rank * local.intermediate_size, local.intermediate_size


WHOLE = ShardLayout(0, 1)  # one rank holding everything
