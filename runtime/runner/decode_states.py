"""The decode batch's recurrent state, in batch order (row `i` is the runner's `decode_rows[i]`).

A decode step hands the model these arrays as mlx-lm `ArraysCache`s and keeps the arrays it
returns: no gather or scatter per step, as in mlx-lm's own batch generation. The batch is
rebuilt only when rows join (their slots' states appended) or leave (the rest kept); a row's
state is never read back, since a preempted request is recomputed.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from mlx_paged.kv.state_pool import arrays_cache


class DecodeStates:
    """Per state layer, the list of `[rows, *shape]` arrays of the decode batch.

    Rows past the batch (a compiled step's padding) hold whatever the padding computed.
    """

    def __init__(self):
        self.arrays: list[list[mx.array]] = []
        self.num_rows = 0

    def join(self, states: list[list[list[mx.array]]]) -> None:
        """Append rows, each given as per state layer its `[1, *shape]` arrays."""
        if not states:
            return
        rows = [mx.concatenate(parts) for parts in _by_array(states)]
        if self.arrays:
            present = [a[: self.num_rows] for a in _flat(self.arrays)]
            rows = [mx.concatenate([a, b]) for a, b in zip(present, rows)]
        self.arrays = _unflat(rows, states[0])
        self.num_rows += len(states)

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows`, in that order."""
        self.num_rows = len(rows)
        if not rows:
            self.arrays = []
            return
        index = mx.array(rows, dtype=mx.int32)
        self.arrays = [[a[index] for a in layer] for layer in self.arrays]

    def caches(self, num_rows: int) -> list[ArraysCache]:
        """One `ArraysCache` per state layer with exactly `num_rows` rows (padded with zeros
        past the batch, or cut to it)."""
        return [arrays_cache([_rows(a, num_rows) for a in layer]) for layer in self.arrays]

    def update(self, caches: list[ArraysCache]) -> None:
        """Keep the arrays the step left in `caches`."""
        self.arrays = [list(c.cache) for c in caches]


def _rows(a: mx.array, n: int) -> mx.array:
    if a.shape[0] == n:
        return a
    if a.shape[0] > n:
        return a[:n]
    return mx.concatenate([a, mx.zeros((n - a.shape[0], *a.shape[1:]), a.dtype)])


def _by_array(states: list[list[list[mx.array]]]) -> list[list[mx.array]]:
    """Per array (layers flattened), the rows' parts in row order."""
    return [list(parts) for parts in zip(*(_flat(s) for s in states))]


def _flat(layers: list[list[mx.array]]) -> list[mx.array]:
    return [a for layer in layers for a in layer]


def _unflat(arrays: list[mx.array], like: list[list[mx.array]]) -> list[list[mx.array]]:
    out, i = [], 0
    for layer in like:
        out.append(arrays[i : i + len(layer)])
        i += len(layer)
    return out
