"""A step's model inputs. Its per-token and per-sequence fields are declared once (FIELDS): what
each holds and what a padding row holds. `host_inputs` computes every field from the step's
chunks in one pass on the host; the eager path makes fresh tensors of them (`prepare_inputs`),
and the CUDA graphs' static buffers are allocated from the same declaration and filled from them
(`StaticInputs`). A new input (an adapter index per token, draft positions) is a field here and
a line of host_inputs. The block tables are the one field not built from lists: the device keeps
every sequence's table (BlockTables), and a step gathers its sequences' rows there."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
import torch

from argosy.kernels.attention_interface import AttentionBackend, AttentionBatch
from argosy.kernels.lora_ops import LoRABatch
from argosy.server.worker.block_tables import BlockTables


class SequenceChunk(msgspec.Struct):
    """One sequence's share of a step, as the device side sees it (a struct: one is made per
    sequence per step)."""

    token_ids: list[int]  # the tokens computed this step
    start: int  # position of the first of them
    block_table: list[int]  # the host's copy, for the new tokens' slots
    sample: bool  # its last token's logits are wanted (and its drafts')
    table_row: int = -1  # its row in the BlockTables the step is given
    lora_slot: int = -1  # its adapter's device slot; -1: the base model
    num_draft: int = 0  # the last of token_ids are drafts, whose logits verify them

    @property
    def num_logits(self) -> int:
        return 1 + self.num_draft if self.sample else 0


@dataclass(frozen=True)
class InputField:
    name: str
    per: Literal["token", "sequence", "table"]  # table: a row of block ids per sequence
    pad: Literal["zero", "one", "none", "null_slot", "null_block"]  # what a padding row of a graph's batch holds


FIELDS = (
    InputField("input_ids", "token", "zero"),
    InputField("positions", "token", "zero"),
    InputField("slot_mapping", "token", "null_slot"),  # the cache slot of each token's K/V
    InputField("lora_slots", "token", "none"),  # the device slot of each token's adapter, -1: none
    InputField("seq_lens", "sequence", "one"),  # keys in the cache after the step
    InputField("block_tables", "table", "null_block"),  # gathered from BlockTables, not from lists
)
_PER = {f.name: f.per for f in FIELDS}


@dataclass
class HostInputs:
    """FIELDS as Python lists, and what only the host needs."""

    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    lora_slots: list[int]
    seq_lens: list[int]
    table_rows: list[int]  # each sequence's row in the step's BlockTables
    table_width: int  # the longest of their tables
    query_start_loc: list[int]  # [seqs + 1]: where each sequence's tokens start in the batch
    q_lens: list[int]  # new tokens per sequence
    logits_rows: list[int]  # the batch index of each sampled chunk's last token (and its drafts')
    lora_runs: list[tuple[int, int, int]]  # (slot, first token, end): consecutive tokens of one adapter

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens)


def host_inputs(chunks: list[SequenceChunk], block_size: int) -> HostInputs:
    # Python lists, then one tensor each: a handful of tensor constructions costs less than the
    # dozens of small tensor ops the same arithmetic takes in torch.
    token_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    lora_slots: list[int] = []
    lora_runs: list[tuple[int, int, int]] = []
    query_start_loc, seq_lens, q_lens, logits_rows, table_rows = [0], [], [], [], []
    width = 0
    for chunk in chunks:
        n, start, table, lora = len(chunk.token_ids), chunk.start, chunk.block_table, chunk.lora_slot
        first = query_start_loc[-1]
        token_ids += chunk.token_ids
        lora_slots += [lora] * n
        if lora >= 0:
            if lora_runs and lora_runs[-1][0] == lora and lora_runs[-1][2] == first:
                lora_runs[-1] = (lora, lora_runs[-1][1], first + n)
            else:
                lora_runs.append((lora, first, first + n))
        if n == 1:  # a decode, the common case
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            positions += range(start, start + n)
            slots += [table[pos // block_size] * block_size + pos % block_size for pos in range(start, start + n)]
        query_start_loc.append(query_start_loc[-1] + n)
        seq_lens.append(start + n)
        q_lens.append(n)
        table_rows.append(chunk.table_row)
        width = max(width, len(table))
        if chunk.sample:
            end = query_start_loc[-1]
            logits_rows += range(end - 1 - chunk.num_draft, end)
    return HostInputs(
        token_ids, positions, slots, lora_slots, seq_lens, table_rows, width, query_start_loc, q_lens, logits_rows,
        lora_runs,
    )  # fmt: skip


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    attention: Any  # what the backend built, for every layer
    logits_rows: torch.Tensor  # [sampled sequences] index of each one's last token in the batch
    lora: LoRABatch | None = None  # None: no token has an adapter


def prepare_inputs(
    chunks: list[SequenceChunk],
    block_size: int,
    device: torch.device,
    backend: AttentionBackend,
    tables: BlockTables | None = None,
) -> ModelInputs:
    """An eager step's inputs: the chunks' new tokens flattened into one batch with no padding,
    fresh tensors of every field, one copy each to the device, the block tables gathered there
    (as wide as the longest), and the backend's metadata over them. Without `tables` (a scratch
    step, a test) the chunks' own lists are the tables."""
    host = host_inputs(chunks, block_size)
    if tables is None:
        tables, host.table_rows = BlockTables.of([c.block_table for c in chunks], device), list(range(len(chunks)))
    fields = {f.name: _int64(getattr(host, f.name)).to(device) for f in FIELDS if f.per != "table"}
    fields["block_tables"] = tables.gather(_int64(host.table_rows).to(device), host.table_width)
    batch = AttentionBatch(
        fields["slot_mapping"],
        _int64(host.query_start_loc).to(device),
        fields["seq_lens"],
        fields["block_tables"],
        block_size,
        host.q_lens,
        max(host.seq_lens),
    )
    lora = LoRABatch(fields["lora_slots"], host.lora_runs) if host.lora_runs else None
    return ModelInputs(
        fields["input_ids"],
        fields["positions"],
        backend.metadata(batch),
        _int64(host.logits_rows).to(device),
        lora,
    )


class StaticInputs:
    """One buffer per field, for up to `max_seqs` sequences of `width` new tokens each (1:
    decodes; k + 1: a speculative step's verifications of k drafts), whose addresses a CUDA graph
    keeps; each step copies its inputs in and pads the rows up to the graph's size with
    sequences of the null block (a cache block no sequence owns)."""

    def __init__(self, max_seqs: int, max_blocks_per_seq: int, block_size: int, device: torch.device, width: int = 1):
        self.block_size, self.null_block, self.device, self.width = block_size, 0, device, width
        shapes = {"token": (max_seqs * width,), "sequence": (max_seqs,), "table": (max_seqs, max_blocks_per_seq)}
        self.buffers = {f.name: torch.zeros(shapes[f.per], dtype=torch.long, device=device) for f in FIELDS}
        self.query_start_loc = torch.arange(0, (max_seqs + 1) * width, width, dtype=torch.long, device=device)
        self.slot_offsets = torch.arange(width, dtype=torch.long, device=device) % block_size

    def fill(self, host: HostInputs, tables: BlockTables, size: int) -> None:
        """Copies a batch's inputs into the first rows, its block tables gathered from `tables`
        on the device; rows up to `size` are padding."""
        n = host.num_seqs
        for f in FIELDS:
            if f.per == "table":
                tables.gather_into(self.buffers[f.name], _int64(host.table_rows).to(self.device, non_blocking=True))
            else:
                values = getattr(host, f.name)
                self.buffers[f.name][: len(values)].copy_(_int64(values), non_blocking=True)
        self.pad(n, size)

    def pad(self, start: int, end: int) -> None:
        """Rows start..end: sequences of `width` tokens in the null block's first slots."""
        values = {
            "zero": 0,
            "one": self.width,  # keys: the padding sequence's own tokens
            "none": -1,
            "null_slot": self.null_block * self.block_size + self.slot_offsets,
            "null_block": self.null_block,
        }
        for f in FIELDS:
            buffer = self.buffers[f.name]
            if f.per == "token":  # [sequences, width]: each padding sequence's tokens alike
                buffer[start * self.width : end * self.width].view(-1, self.width)[:] = values[f.pad]
            else:
                buffer[start:end] = values[f.pad]

    def field(self, name: str, size: int) -> torch.Tensor:
        return self.buffers[name][: size * self.width if _PER[name] == "token" else size]

    def batch(self, size: int, max_model_len: int) -> AttentionBatch:
        return AttentionBatch(
            self.field("slot_mapping", size),
            self.query_start_loc[: size + 1],
            self.field("seq_lens", size),
            self.field("block_tables", size),
            self.block_size,
            [self.width] * size,
            max_model_len,
        )


def _int64(values: list[int]) -> torch.Tensor:
    # Through an array: three times faster than torch.tensor(list), which inspects every item.
    return torch.frombuffer(array("q", values), dtype=torch.long) if values else torch.empty(0, dtype=torch.long)
