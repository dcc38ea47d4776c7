"""The device's block tables: rows kept equal to the engine's tables through every kind of change
the plans carry, and a step's inputs built with host work that does not grow with the tables'
length (which, built from lists, cost 27 ms a step at 256 sequences of 32k tokens)."""

from __future__ import annotations

import random
import tracemalloc

import pytest
import torch

from argosy.kernels.attention_backend import TorchAttention
from argosy.server.worker.block_tables import BlockTables
from argosy.server.worker.step_inputs import SequenceChunk, StaticInputs, host_inputs, prepare_inputs

CPU = torch.device("cpu")


def test_rows_follow_appends_replacements_resets_and_reuse_and_survive_growth():
    rng = random.Random(0)
    tables = BlockTables(max_blocks_per_seq=12, device=CPU, rows=2)
    expected: dict[int, list[int]] = {}
    for step in range(200):
        action = rng.random()
        if action < 0.15 or not expected:
            row = tables.add()
            assert row not in expected
            expected[row] = []
        elif action < 0.25:
            gone = rng.choice(sorted(expected))
            tables.release(gone)
            del expected[gone]
        for row, table in expected.items():
            if rng.random() < 0.5:
                # Append (kept = length), copy-on-write of the last block, or a preemption's reset.
                kept = rng.choice([len(table), max(0, len(table) - 1), 0])
                blocks = [rng.randrange(1000) for _ in range(rng.randrange(0, 12 - kept + 1))]
                tables.change(row, kept, blocks)
                expected[row] = table[:kept] + blocks
        tables.flush()
        for row, table in expected.items():
            assert tables.table[row, : len(table)].tolist() == table, step
    assert tables.table.shape[0] > 2  # it grew, keeping every row


def test_a_released_row_is_handed_out_again():
    tables = BlockTables(4, CPU, rows=2)
    first, second = tables.add(), tables.add()
    tables.release(first)
    assert tables.add() == first and {first, second} == {0, 1}


def test_a_table_longer_than_a_row_is_refused_rather_than_written_into_the_next():
    tables = BlockTables(4, CPU, rows=2)
    with pytest.raises(ValueError, match="5 blocks; rows hold 4"):
        tables.change(tables.add(), 2, [1, 2, 3])
    with pytest.raises(ValueError, match="a buffer 5 blocks wide for tables 4 wide"):
        tables.gather_into(torch.zeros(2, 5, dtype=torch.long), torch.tensor([0]))


def test_a_step_gathers_its_rows_in_the_batch_order():
    tables = BlockTables.of([[1, 2, 3], [4], [5, 6]], CPU)
    assert tables.gather(torch.tensor([2, 0]), 2).tolist() == [[5, 6], [1, 2]]


def sequences(num: int, context: int, block_size: int) -> tuple[list[SequenceChunk], BlockTables]:
    blocks = context // block_size
    lists = [list(range(i * blocks, (i + 1) * blocks)) for i in range(num)]
    return [SequenceChunk([5], context - 1, t, True, row) for row, t in enumerate(lists)], BlockTables.of(lists, CPU)


def python_bytes(fn) -> int:
    """The peak of Python's own allocations while fn runs (tensor storage is not among them)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


HOST_BUDGET = 128 << 10  # bytes: a few small lists per step, whatever the contexts' length


@pytest.mark.parametrize("context", [1024, 32768])
def test_the_inputs_of_256_decodes_take_host_work_that_does_not_grow_with_their_context(context):
    """Stated as Python allocations, which cannot be noisy: the tables built from lists
    allocated 8.6 MB a step at 32k (and 27 ms), the gather about 40 KB at any context."""
    chunks, tables = sequences(256, context, block_size=16)
    static = StaticInputs(256, context // 16, 16, CPU)
    graph = python_bytes(lambda: static.fill(host_inputs(chunks, 16), tables, 256))
    eager = python_bytes(lambda: prepare_inputs(chunks, 16, CPU, TorchAttention(use_cpu_kernels=True), tables))
    assert graph < HOST_BUDGET and eager < HOST_BUDGET, (graph, eager)
    assert static.field("block_tables", 256)[255, -1] == 256 * (context // 16) - 1  # the tables did arrive
