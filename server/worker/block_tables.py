"""BlockTables: every sequence's block table on the device, one row each, kept up to date with the
changes the step plans carry. A step's tables are a gather of its sequences' rows on the device,
so the host's work per step follows what changed (a block every block_size tokens of a decode),
never the tables' length: built from lists at every step, the tables of 256 sequences of 32k
tokens cost 27 ms of host time.

Entries past a sequence's own length hold whatever its row held before: always a block of the
same cache (or 0), and never read, since every kernel masks by the sequence's length."""

from __future__ import annotations

from array import array

import torch


class BlockTables:
    def __init__(self, max_blocks_per_seq: int, device: torch.device, rows: int = 64):
        self.width, self.device = max_blocks_per_seq, device
        self.table = torch.zeros(rows, max_blocks_per_seq, dtype=torch.long, device=device)
        self._free = list(range(rows - 1, -1, -1))  # popped from the end: rows in order
        self._positions: list[int] = []  # flat positions of the writes not yet made, and their blocks
        self._blocks: list[int] = []

    @classmethod
    def of(cls, tables: list[list[int]], device: torch.device) -> BlockTables:
        """Rows 0.. holding `tables`: for steps outside the engine's sequences (scratch steps, tests)."""
        built = cls(max([1, *map(len, tables)]), device, rows=max(1, len(tables)))
        for table in tables:
            built.change(built.add(), 0, table)
        built.flush()
        return built

    def add(self) -> int:
        """A row for a new sequence, its table empty."""
        if not self._free:
            self._grow()
        return self._free.pop()

    def release(self, row: int) -> None:
        self._free.append(row)

    @property
    def rows_in_use(self) -> int:
        return self.table.shape[0] - len(self._free)

    def change(self, row: int, kept: int, blocks: list[int]) -> None:
        """The row's table keeps its first `kept` entries and continues with `blocks`; written at
        the next flush."""
        if kept + len(blocks) > self.width:  # it would run into the next row
            raise ValueError(f"a block table of {kept + len(blocks)} blocks; rows hold {self.width}")
        start = row * self.width + kept
        self._positions += range(start, start + len(blocks))
        self._blocks += blocks

    def flush(self) -> None:
        """Every change since the last flush, in one copy to the device and one scatter."""
        if not self._positions:
            return
        n = len(self._positions)
        both = torch.frombuffer(array("q", self._positions + self._blocks), dtype=torch.long).to(self.device)
        self.table.view(-1).index_copy_(0, both[:n], both[n:])
        self._positions, self._blocks = [], []

    def gather(self, rows: torch.Tensor, width: int) -> torch.Tensor:
        """[len(rows), width]: the first `width` entries of each row, a new tensor."""
        return self.table[:, :width].index_select(0, rows)

    def gather_into(self, out: torch.Tensor, rows: torch.Tensor) -> None:
        """Whole rows into the first len(rows) rows of `out` (a graph's static buffer, whose
        address must not change: it is never resized)."""
        if out.shape[1] != self.width:
            raise ValueError(f"a buffer {out.shape[1]} blocks wide for tables {self.width} wide")
        torch.index_select(self.table, 0, rows, out=out[: len(rows)])

    def _grow(self) -> None:
        # Rarely: the rows belong to the sequences the engine holds, running or preempted.
        rows = self.table.shape[0]
        grown = torch.zeros(2 * rows, self.width, dtype=torch.long, device=self.device)
        grown[:rows] = self.table
        self.table = grown
        self._free += range(2 * rows - 1, rows - 1, -1)
