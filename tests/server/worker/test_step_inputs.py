"""A step's model inputs, built from the scheduled chunks alone: flattened tokens, their
positions and cache slots, and the rows whose logits are wanted; and the CUDA graphs' static
buffers, built from the same declared fields."""

from __future__ import annotations

import torch

from argosy.kernels.attention_backend import TorchAttention
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.step_inputs import FIELDS, SequenceChunk, StaticInputs, host_inputs, prepare_inputs

BLOCK = 4


def test_a_mixed_step_flattens_without_padding():
    decode = SequenceChunk([7], start=5, block_table=[3, 9], sample=True)  # position 5: block 9, offset 1
    prefill = SequenceChunk([1, 2, 3], start=0, block_table=[4], sample=True)
    partial = SequenceChunk([5, 6], start=4, block_table=[0, 2, 8], sample=False)  # a chunk that is not the end
    inputs = prepare_inputs([decode, prefill, partial], BLOCK, torch.device("cpu"), TorchAttention())
    assert inputs.input_ids.tolist() == [7, 1, 2, 3, 5, 6]
    assert inputs.positions.tolist() == [5, 0, 1, 2, 4, 5]
    assert inputs.attention.slot_mapping.tolist() == [9 * BLOCK + 1, 16, 17, 18, 2 * BLOCK, 2 * BLOCK + 1]
    assert inputs.attention.seq_lens.tolist() == [6, 3, 6]
    assert inputs.logits_rows.tolist() == [0, 3]  # the last token of each sampled chunk


def test_block_tables_are_padded_to_the_longest():
    inputs = prepare_inputs(
        [SequenceChunk([1], 0, [5], True), SequenceChunk([2], 8, [1, 2, 3], True)],
        BLOCK,
        torch.device("cpu"),
        TorchAttention(),
    )
    assert inputs.attention.block_tables.tolist() == [[5, 0, 0], [1, 2, 3]]
    assert inputs.attention.slot_mapping.tolist() == [20, 12]


def test_graph_buffers_come_from_the_same_fields_and_hold_what_the_eager_inputs_hold():
    """Every declared field has a static buffer; a decode batch copied in holds, row for row, the
    eager step's values (block tables gathered from the sequences' rows, in any order), and the
    padding rows up to the graph's size decode the null block."""
    tables = BlockTables(max_blocks_per_seq=4, device=torch.device("cpu"), rows=4)
    rows = [tables.add() for _ in range(4)][::-1][:3]  # rows 3, 2, 1: not the batch's order
    lists = [[3, 9], [4], [1, 2, 6]]
    for row, table in zip(rows, lists):
        tables.change(row, 0, table)
    tables.flush()
    chunks = [SequenceChunk([7], 5, lists[0], True, rows[0]), SequenceChunk([8], 2, lists[1], True, rows[1]),
              SequenceChunk([9], 9, lists[2], True, rows[2])]  # fmt: skip
    static = StaticInputs(max_seqs=8, max_blocks_per_seq=4, block_size=BLOCK, device=torch.device("cpu"))
    static.null_block = 11
    assert set(static.buffers) == {f.name for f in FIELDS}
    static.fill(host_inputs(chunks, BLOCK), tables, size=4)
    eager = prepare_inputs(chunks, BLOCK, torch.device("cpu"), TorchAttention(), tables)
    assert static.field("input_ids", 3).tolist() == eager.input_ids.tolist()
    assert static.field("positions", 3).tolist() == eager.positions.tolist()
    assert static.field("slot_mapping", 3).tolist() == eager.attention.slot_mapping.tolist()
    assert static.field("seq_lens", 3).tolist() == eager.attention.seq_lens.tolist()
    # Each row's own entries; past them nothing is read.
    for i, table in enumerate(lists):
        assert static.field("block_tables", 3)[i, : len(table)].tolist() == table
        assert eager.attention.block_tables[i, : len(table)].tolist() == table
    # Row 3 pads the batch up to 4: one key, at the null block's first slot.
    pad = {f.name: static.buffers[f.name][3].tolist() for f in FIELDS}
    assert pad == {"input_ids": 0, "positions": 0, "slot_mapping": 11 * BLOCK, "lora_slots": -1, "seq_lens": 1,
                   "block_tables": [11, *static.buffers["block_tables"][3, 1:].tolist()]}  # fmt: skip


def test_static_inputs_of_verification_width_hold_each_sequences_tokens_and_pad_with_the_null_block():
    """Buffers for sequences of 3 new tokens (a speculative step of 2 drafts): a batch copied in
    holds the eager step's values token for token, and a padding sequence's 3 tokens go to the
    null block's first 3 slots and see only themselves, even past a block's end."""
    tables = BlockTables(max_blocks_per_seq=4, device=torch.device("cpu"), rows=2)
    rows = [tables.add() for _ in range(2)]
    lists = [[3, 9, 5], [1, 2, 6, 8]]
    for row, table in zip(rows, lists):
        tables.change(row, 0, table)
    tables.flush()
    chunks = [SequenceChunk([7, 8, 9], 3, lists[0], True, rows[0], num_draft=2),
              SequenceChunk([4, 5, 6], 5, lists[1], True, rows[1], num_draft=2)]  # fmt: skip
    static = StaticInputs(max_seqs=4, max_blocks_per_seq=4, block_size=2, device=torch.device("cpu"), width=3)
    static.null_block = 11
    host = host_inputs(chunks, 2)
    static.fill(host, tables, size=4)
    eager = prepare_inputs(chunks, 2, torch.device("cpu"), TorchAttention(), tables)
    assert static.field("input_ids", 2).tolist() == eager.input_ids.tolist() == [7, 8, 9, 4, 5, 6]
    assert static.field("positions", 2).tolist() == eager.positions.tolist()
    assert static.field("slot_mapping", 2).tolist() == eager.attention.slot_mapping.tolist()
    assert static.field("seq_lens", 2).tolist() == eager.attention.seq_lens.tolist() == [6, 8]
    assert host.logits_rows == [0, 1, 2, 3, 4, 5]
    batch = static.batch(4, 64)
    assert batch.query_start_loc.tolist() == [0, 3, 6, 9, 12] and batch.q_lens == [3] * 4
    # Sequences 2 and 3 pad the batch: slots 22, 23, then 22 again (block size 2), 3 keys each.
    assert static.field("slot_mapping", 4)[6:].tolist() == [22, 23, 22] * 2
    assert static.field("seq_lens", 4)[2:].tolist() == [3, 3]
    assert static.field("block_tables", 4)[2:].tolist() == [[11] * 4] * 2
    assert static.field("lora_slots", 4)[6:].tolist() == [-1] * 6
