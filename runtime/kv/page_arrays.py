"""A layer's 16-bit K and V page arrays (`KVPages`) and where a forward writes into them
(`SlotMapping`).

The pages are stored as flat rows `[num_blocks * block_size, heads, head_dim]`: a write of N
new rows is then one `put_along_axis` node, whose index every layer of the forward shares,
where an indexed assignment into 4D pages adds a reshape (and at batch 1 a squeeze and a
broadcast) to each write. MLX's host time per node sets a decode step's pace.
"""

from __future__ import annotations

from typing import NamedTuple

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.kernel_inputs import input_array


class SlotMapping:
    """Where each of N new tokens' K/V is written: `slots` `(N, 1, 1)` int32 flat slot numbers
    (`block * block_size + offset`)."""

    def __init__(self, slots: mx.array):
        self.slots = slots
        self._indices: dict[tuple[int, ...], mx.array] = {}
        self._rows: tuple[mx.array, mx.array] | None = None

    def rows(self, block_size: int) -> tuple[mx.array, mx.array]:
        """The slots as `(block ids, offsets in the block)` `(N,)`: the index of quantized
        pages' rows, built once a forward."""
        if self._rows is None:
            flat = self.slots.reshape(-1)
            self._rows = (flat // block_size, flat % block_size)
        return self._rows

    def indices(self, shape: tuple[int, ...]) -> mx.array:
        """`slots` broadcast to `shape` `(N, heads, dim)`: the index of a write of that shape,
        built once a forward (every layer of that shape shares it)."""
        found = self._indices.get(shape)
        if found is None:
            found = self._indices[shape] = mx.broadcast_to(self.slots, shape)
        return found


class KVPages(NamedTuple):
    """One layer's K and V pages in the model's dtype, flat: `(num_blocks * block_size, heads,
    head_dim)`, so that a write is one `put_along_axis` of the new rows."""

    k: mx.array
    v: mx.array

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def write(self, mapping: SlotMapping, keys: mx.array, values: mx.array) -> KVPages:
        """The pages with `(N, heads, head_dim)` keys and values written at `mapping`'s slots
        (the scatters reuse the buffers of pages nothing else holds)."""
        k = mx.put_along_axis(self.k, mapping.indices(keys.shape), keys, axis=0)
        v = mx.put_along_axis(self.v, mapping.indices(values.shape), values, axis=0)
        return KVPages(k, v)


def make_slot_mapping(slots) -> SlotMapping:
    """The `SlotMapping` of flat slot numbers `slots` (`block * block_size + offset`, a list or
    numpy array)."""
    return SlotMapping(input_array(np.asarray(slots, dtype=np.int32).reshape(-1, 1, 1)))
