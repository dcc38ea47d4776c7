"""A step's model inputs: the scheduled sequences' new tokens flattened into one batch with no
padding, their positions, the cache slots their keys and values go to, the attention
metadata every layer reuses, and the rows whose logits are wanted. Pure tensor building on
the host, then one copy to the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from argosy.kernels.attention_backend import AttentionBackend, AttentionBatch
from argosy.server.engine.scheduler import SchedulerOutput


@dataclass
class SequenceChunk:
    """One sequence's share of a step."""

    token_ids: list[int]  # the tokens computed this step
    start: int  # position of the first of them
    block_table: list[int]
    sample: bool  # its last token's logits are wanted


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    attention: Any  # what the backend built, for every layer
    logits_rows: torch.Tensor  # [sampled sequences] index of each one's last token in the batch


def chunks_of(out: SchedulerOutput) -> list[SequenceChunk]:
    chunks = []
    for item in out.scheduled:
        start = item.seq.num_computed_tokens
        chunks.append(
            SequenceChunk(
                item.seq.token_ids[start : start + item.num_new_tokens], start, item.seq.block_table, item.completes
            )
        )
    return chunks


def prepare_inputs(
    chunks: list[SequenceChunk], block_size: int, device: torch.device, backend: AttentionBackend
) -> ModelInputs:
    token_ids = [t for chunk in chunks for t in chunk.token_ids]
    q_len_list = [len(chunk.token_ids) for chunk in chunks]
    q_lens = torch.tensor(q_len_list, dtype=torch.long)
    ctx_start = torch.tensor([chunk.start for chunk in chunks], dtype=torch.long)
    query_start_loc = torch.zeros(len(chunks) + 1, dtype=torch.long)
    torch.cumsum(q_lens, 0, out=query_start_loc[1:])
    seq_of_token = torch.repeat_interleave(torch.arange(len(chunks)), q_lens)
    positions = ctx_start[seq_of_token] + torch.arange(len(token_ids)) - query_start_loc[seq_of_token]
    block_tables = _pad([chunk.block_table for chunk in chunks])
    slots = block_tables[seq_of_token, positions // block_size] * block_size + positions % block_size
    sampled = [i for i, chunk in enumerate(chunks) if chunk.sample]
    logits_rows = query_start_loc[1:][sampled] - 1
    seq_lens = ctx_start + q_lens
    batch = AttentionBatch(
        slots.to(device),
        query_start_loc.to(device),
        seq_lens.to(device),
        block_tables.to(device),
        block_size,
        q_len_list,
        int(seq_lens.max()),
    )
    return ModelInputs(
        torch.tensor(token_ids, dtype=torch.long).to(device),
        positions.to(device),
        backend.metadata(batch),
        logits_rows.to(device),
    )


def _pad(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long)
