"""A step's model inputs, built from the scheduled chunks alone: flattened tokens, their
positions and cache slots, and the rows whose logits are wanted."""

from __future__ import annotations

import torch

from argosy.kernels.attention_backend import TorchAttention
from argosy.server.worker.model_inputs import SequenceChunk, prepare_inputs

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
