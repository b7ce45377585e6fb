"""The arrays of the recurrent-state pool: per state layer, per array the layer keeps,
`[num_slots, *shape]`. A forward's rows read their slots into mlx-lm `ArraysCache`s (a gather),
the model advances them as it would its own caches, and the runner scatters them back.

Like `PagedKVPool`, the pool holds the only references to its arrays, so the scatters can
reuse the buffers instead of copying the pool.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache


class StatePool:
    """Per state layer, a list of `[num_slots, *shape]` arrays.

    Args:
        layout: per state layer, the `(shape, dtype)` of each array one request keeps.
        num_slots: slots, the null slot 0 included.
    """

    def __init__(self, layout: tuple, num_slots: int):
        self.layout = layout
        self.num_slots = num_slots
        self.arrays = self._zeros()

    def _zeros(self) -> list[list[mx.array]]:
        arrays = [
            [mx.zeros((self.num_slots, *shape), dtype) for shape, dtype in layer]
            for layer in self.layout
        ]
        mx.eval(arrays)
        return arrays

    @property
    def slot_bytes(self) -> int:
        return slot_bytes(self.layout)

    @property
    def nbytes(self) -> int:
        return self.num_slots * self.slot_bytes

    def caches(self, slots: mx.array) -> list[ArraysCache]:
        """One `ArraysCache` per state layer holding rows `slots` (a gather)."""
        out = []
        for layer in self.arrays:
            cache = ArraysCache(len(layer))
            cache.cache = [a[slots] for a in layer]
            out.append(cache)
        return out

    def write(self, caches: list[ArraysCache], slots: mx.array) -> None:
        """Scatter each cache's arrays, as the forward left them, back to `slots`."""
        for layer, cache in zip(self.arrays, caches):
            for i, new in enumerate(cache.cache):
                old = layer[i]
                layer[i] = None  # drop our reference: the scatter may reuse the buffer
                old[slots] = new.astype(old.dtype)
                layer[i] = old

    def fill(self, pending: list[tuple[int, int | None]]) -> None:
        """Copy each `(slot, source)`: the source slot's state, or zeros where it is None."""
        for slot, source in pending:
            for layer in self.arrays:
                for i, old in enumerate(layer):
                    layer[i] = None
                    old[slot] = 0 if source is None else old[source]
                    layer[i] = old

    def copy(self, dst: int, src: int) -> None:
        """Slot `dst` takes slot `src`'s state (a snapshot)."""
        self.fill([(dst, src)])

    def repair(self) -> bool:
        """After a failed step: evaluate the arrays, or zero them when their pending writes
        throw. True if the contents were lost."""
        try:
            mx.eval(self.arrays)
            return False
        except Exception:
            self.arrays = self._zeros()
            return True


def slot_bytes(layout: tuple) -> int:
    """Bytes one request's state takes, every state layer together."""
    total = 0
    for layer in layout:
        for shape, dtype in layer:
            n = dtype.size
            for d in shape:
                n *= d
            total += n
    return total
