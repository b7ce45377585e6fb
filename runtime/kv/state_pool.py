"""The recurrent state of a hybrid model's requests, one entry per state slot (`StateSlots`):
per state layer, the arrays mlx-lm's `ArraysCache` keeps for one sequence, `[1, *shape]`.

MLX arrays are values, so a slot's state is replaced after each forward, never written in place,
and a snapshot is a second reference to the same arrays: keeping one copies nothing. The budget
reserves `num_slots` states; a slot holds its arrays until it is filled again.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache


class StatePool:
    """Each slot's state: `states[slot]`, per state layer a list of `[1, *shape]` arrays.

    Args:
        layout: per state layer, the `(shape, dtype)` of each array one request keeps.
        num_slots: slots, slot 0 (never handed out) included.
    """

    def __init__(self, layout: tuple, num_slots: int):
        self.layout = layout
        self.num_slots = num_slots
        # The state of a request that starts from nothing, shared by reference.
        self.zeros = [[mx.zeros((1, *shape), dtype) for shape, dtype in layer] for layer in layout]
        self.states: dict[int, list[list[mx.array]]] = {}

    @property
    def slot_bytes(self) -> int:
        return slot_bytes(self.layout)

    @property
    def nbytes(self) -> int:
        """Bytes the budget reserves: every slot's state but the unused slot 0's."""
        return (self.num_slots - 1) * self.slot_bytes

    def fill(self, pending: list[tuple[int, int | None]]) -> None:
        """Each `(slot, source)` takes the source slot's state, or zeros where it is None."""
        for slot, source in pending:
            self.states[slot] = self.zeros if source is None else self.states[source]

    def caches(self, slot: int) -> list[ArraysCache]:
        """One `ArraysCache` per state layer holding the slot's state, for a forward of its row."""
        return [arrays_cache(arrays) for arrays in self.states[slot]]

    def store(self, slot: int, caches: list[ArraysCache]) -> None:
        """The slot's state is what the forward left in `caches`."""
        self.states[slot] = [list(c.cache) for c in caches]

    def take(self, slot: int) -> list[list[mx.array]]:
        """The slot's state, handed to the decode batch; the slot keeps none of it."""
        return self.states.pop(slot)

    def repair(self) -> bool:
        """After a failed step: evaluate the states, or drop them all when their pending work
        throws. True if they were lost."""
        try:
            mx.eval(list(self.states.values()))
            return False
        except Exception:
            self.states.clear()
            return True


def arrays_cache(arrays: list[mx.array]) -> ArraysCache:
    """An mlx-lm `ArraysCache` holding `arrays` (what a state layer's forward reads and sets)."""
    cache = ArraysCache(len(arrays))
    cache.cache = list(arrays)
    return cache


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
