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
        block_size: tokens per page.
        page_scale: pages per block (`KVCacheGroups.page_scale`): the table holds pages, block
            b's being b x scale ... b x scale + scale - 1.
    """

    def __init__(self, block_size: int, page_scale: int = 1):
        self.block_size = block_size
        self.page_scale = page_scale
        self.table = np.zeros((_FIRST_ROWS, _FIRST_BLOCKS), dtype=np.int32)
        # Pages copied into each row so far (a list: `sync` reads it once a row every step).
        self.num_pages: list[int] = []
        # Each row's live block list, owned by the KV cache manager, which appends to it while
        # the row decodes (and trims what rejected drafts took).
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
        self.num_pages.append(0)
        self.table[row] = 0

    def keep_rows(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep`, in that order (rows that left the batch are dropped)."""
        n = len(keep)
        index = np.asarray(keep, dtype=np.int64)
        self.table[:n] = self.table[index]
        self.table[n : self.num_rows] = 0
        self.num_pages = [self.num_pages[i] for i in keep]
        self._blocks = [self._blocks[i] for i in keep]

    def clear(self) -> None:
        self.keep_rows([])

    def sync(self) -> int:
        """Copy in the pages of the blocks each row gained since the last call, and clear those
        of blocks it gave back (rejected drafts); returns the widest row's number of pages."""
        widest, scale, num_pages = 0, self.page_scale, self.num_pages
        for row, blocks in enumerate(self._blocks):
            have, now = num_pages[row], len(blocks) * scale
            if now < have:
                self.table[row, now:have] = 0
            elif now > have:
                if now > self.table.shape[1]:
                    self._grow(blocks=2 * now)
                ids = [b.block_id for b in blocks[have // scale :]]
                self.table[row, have:now] = page_ids(ids, scale)
            num_pages[row] = now
            widest = max(widest, now)
        return widest

    def decode_inputs(
        self, context_lens: np.ndarray, num_rows: int, width: int, rows: np.ndarray | None = None
    ):
        """Block tables `(num_rows, width)`, context lengths and slot mapping of a decode step
        whose rows write their token at `context_lens - 1`; rows past the batch are padding
        (length 1, writing slot 0 of the null block). With `rows`, query row i is a token of
        table row `rows[i]` (a speculative step verifies several tokens of one request). The
        tables are a view of this table without `rows`: convert them before the next `sync`."""
        n = len(context_lens)
        if num_rows > len(self.table) or width > self.table.shape[1]:
            self._grow(rows=max(num_rows, len(self.table)), blocks=max(width, self.table.shape[1]))
        lens = np.ones(num_rows, dtype=np.int32)
        lens[:n] = context_lens
        positions = lens - 1
        if rows is None:
            tables = self.table[:num_rows, :width]
        else:
            index = np.zeros(num_rows, np.int64)
            index[:n] = rows
            tables = self.table[index, :width]
            tables[n:] = 0  # padding rows read the null block, as without `rows`
        slots = tables[np.arange(num_rows), positions // self.block_size] * self.block_size
        slots += positions % self.block_size
        slots[n:] = 0
        return tables, lens, slots

    def _grow(self, rows: int | None = None, blocks: int | None = None) -> None:  # in pages
        rows = rows or len(self.table)
        blocks = blocks or self.table.shape[1]
        table = np.zeros((rows, blocks), dtype=np.int32)
        old_rows, old_blocks = self.table.shape
        table[:old_rows, :old_blocks] = self.table
        self.table = table


def page_ids(block_ids: list[int], scale: int) -> list[int]:
    """The pages of blocks `block_ids` where a block holds `scale` pages."""
    if scale == 1:
        return block_ids
    return [b * scale + j for b in block_ids for j in range(scale)]
