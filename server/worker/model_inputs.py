"""A step's model inputs: the scheduled sequences' new tokens flattened into one batch with no
padding, their positions, the cache slots their keys and values go to, the attention
metadata every layer reuses, and the rows whose logits are wanted. Pure tensor building on
the host, then one copy to the device."""

from __future__ import annotations

from array import array
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
    # Built as Python lists, then one tensor each: a handful of tensor constructions costs
    # less than the dozens of small tensor ops the same arithmetic takes in torch.
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc, seq_lens, q_lens, logits_rows = [0], [], [], []
    for chunk in chunks:
        n, start, table = len(chunk.token_ids), chunk.start, chunk.block_table
        token_ids += chunk.token_ids
        if n == 1:  # a decode, the common case
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            positions += range(start, start + n)
            slots += [table[pos // block_size] * block_size + pos % block_size for pos in range(start, start + n)]
        query_start_loc.append(query_start_loc[-1] + n)
        seq_lens.append(start + n)
        q_lens.append(n)
        if chunk.sample:
            logits_rows.append(query_start_loc[-1] - 1)
    batch = AttentionBatch(
        _tensor(slots, device),
        _tensor(query_start_loc, device),
        _tensor(seq_lens, device),
        _pad([chunk.block_table for chunk in chunks]).to(device),
        block_size,
        q_lens,
        max(seq_lens),
    )
    return ModelInputs(
        _tensor(token_ids, device), _tensor(positions, device), backend.metadata(batch), _tensor(logits_rows, device)
    )


def _tensor(values: list[int], device: torch.device) -> torch.Tensor:
    return _int64(values).to(device)


def _int64(values: list[int]) -> torch.Tensor:
    # Through an array: three times faster than torch.tensor(list), which inspects every item.
    return torch.frombuffer(array("q", values), dtype=torch.long) if values else torch.empty(0, dtype=torch.long)


def _pad(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    pad = [0] * width
    flat: list[int] = []  # one flat list converts much faster than a list of lists
    for t in tables:
        flat += t
        if len(t) < width:
            flat += pad[len(t) :]
    return _int64(flat).view(len(tables), width)
