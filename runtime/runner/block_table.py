"""The decode batch's block tables, kept from step to step (vLLM's `BlockTable`).

Row `i` mirrors the runner's `decode_rows[i]`. Each step copies only the block ids a row gained
since the last one (at most one block per row per decode step), so building a step's inputs is
a few numpy operations over the batch, not a Python loop over every block of every row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_FIRST_ROWS = 8
_FIRST_BLOCKS = 64


class BlockTable:
    """Block ids of the decode rows in one preallocated int32 array; padding is block 0 (the
    null block).

    Args:
        block_size: tokens per block.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.table = np.zeros((_FIRST_ROWS, _FIRST_BLOCKS), dtype=np.int32)
        self.num_blocks = np.zeros(_FIRST_ROWS, dtype=np.int32)
        # Each row's live block list, owned by the KV cache manager, which only appends to it
        # while the row decodes.
        self._blocks: list[list] = []

    @property
    def num_rows(self) -> int:
        return len(self._blocks)

    def add_row(self, blocks: list) -> None:
        """Append a row whose blocks are `blocks` (the manager's list for the request)."""
        row = self.num_rows
        if row == len(self.table):
            self._grow(rows=2 * row)
        self._blocks.append(blocks)
        self.num_blocks[row] = 0
        self.table[row] = 0

    def keep_rows(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep`, in that order (rows that left the batch are dropped)."""
        n = len(keep)
        index = np.asarray(keep, dtype=np.int64)
        self.table[:n] = self.table[index]
        self.num_blocks[:n] = self.num_blocks[index]
        self.table[n : self.num_rows] = 0
        self.num_blocks[n : self.num_rows] = 0
        self._blocks = [self._blocks[i] for i in keep]

    def clear(self) -> None:
        self.keep_rows([])

    def sync(self) -> int:
        """Copy in the block ids each row gained since the last call; returns the widest row's
        number of blocks."""
        widest = 0
        for row, blocks in enumerate(self._blocks):
            have, now = int(self.num_blocks[row]), len(blocks)
            if now > have:
                if now > self.table.shape[1]:
                    self._grow(blocks=2 * now)
                self.table[row, have:now] = [b.block_id for b in blocks[have:now]]
                self.num_blocks[row] = now
            widest = max(widest, now)
        return widest

    def decode_inputs(self, context_lens: np.ndarray, num_rows: int, width: int):
        """Block tables `(num_rows, width)`, context lengths and slot mapping of a decode step
        whose rows write their token at `context_lens - 1`; rows past the batch are padding
        (length 1, writing slot 0 of the null block). The tables are a view of this table:
        convert them before the next `sync`."""
        n = len(context_lens)
        if num_rows > len(self.table) or width > self.table.shape[1]:
            self._grow(rows=max(num_rows, len(self.table)), blocks=max(width, self.table.shape[1]))
        lens = np.ones(num_rows, dtype=np.int32)
        lens[:n] = context_lens
        positions = lens - 1
        tables = self.table[:num_rows, :width]
        slots = tables[np.arange(num_rows), positions // self.block_size] * self.block_size
        slots += positions % self.block_size
        slots[n:] = 0
        return tables, lens, slots

    def _grow(self, rows: int | None = None, blocks: int | None = None) -> None:
        rows = rows or len(self.table)
        blocks = blocks or self.table.shape[1]
        table = np.zeros((rows, blocks), dtype=np.int32)
        old_rows, old_blocks = self.table.shape
        table[:old_rows, :old_blocks] = self.table
        num_blocks = np.zeros(rows, dtype=np.int32)
        num_blocks[:old_rows] = self.num_blocks
        self.table, self.num_blocks = table, num_blocks
