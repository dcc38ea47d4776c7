"""VocabShard: with tensor parallelism, the embedding and the LM head split by vocabulary rows,
chosen by measurement over holding them whole on every rank (bench/tp_vocabulary.py prints the
comparison; docs/benchmarks/tensor-parallelism.md quotes it). Each rank holds a contiguous run
of the token rows, the last one padded with zero rows so that every run is the same length. A token's embedding
is looked up on the rank that holds it, zero on the others, and an all-reduce makes it whole;
each rank's head gives the logits of its rows, and a gather puts them side by side on rank 0,
which samples."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class VocabShard:
    start: int  # the first token row this rank holds
    rows: int  # rows per rank, padding included
    vocab_size: int  # the whole vocabulary's
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    gather: Callable[[torch.Tensor], torch.Tensor]  # every rank's last dimension side by side, on rank 0

    def embed(self, embedding: nn.Embedding, input_ids: torch.Tensor) -> torch.Tensor:
        # Masks, not indexing by a condition: the shapes stay fixed for CUDA graphs.
        local = input_ids - self.start
        elsewhere = (local < 0) | (local >= self.rows)
        x = embedding(local.masked_fill(elsewhere, 0))
        return self.all_reduce(x.masked_fill_(elsewhere.unsqueeze(-1), 0))

    def logits(self, local: torch.Tensor) -> torch.Tensor:
        """The whole vocabulary's logits on rank 0 (the padding rows cut off); on the other ranks,
        what their part is: nothing reads it."""
        return self.gather(local)[..., : self.vocab_size].contiguous()  # the sampler edits rows in place
