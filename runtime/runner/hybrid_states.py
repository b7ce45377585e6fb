"""Where a hybrid model's recurrent state lives while the paged runner works: in its request's
state slot while the prompt is prefilled (`StatePool`), then in the decode batch
(`DecodeStates`) from the step the request joins it until it leaves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from mlx_paged.kv.kv_cache_manager import KVCacheManager
from mlx_paged.kv.state_pool import StatePool, arrays_cache
from mlx_paged.runner.decode_states import DecodeStates


class HybridStates:
    """The runner's view of recurrent state: slots through `kv.state_slots`, arrays in `pool`.

    Args:
        pool: the slots' states.
        kv: the KV cache manager holding the slot bookkeeping and the prefix cache.
    """

    def __init__(self, pool: StatePool, kv: KVCacheManager):
        self.pool = pool
        self.kv = kv
        self.decode = DecodeStates()

    @property
    def slots(self):
        return self.kv.state_slots

    def reset(self) -> bool:
        """Drop the decode batch; True if the slots' states were lost (after a failed step)."""
        self.decode = DecodeStates()
        return self.pool.repair()

    @property
    def bytes_in_use(self) -> int:
        """State bytes of live requests (snapshots are cache, like free blocks with a hash)."""
        return len(self.slots.req_to_slot) * self.pool.slot_bytes

    def fill_pending(self) -> None:
        """Zero or restore (from a snapshot) the slots handed out since the last forward."""
        self.pool.fill(self.slots.take_pending())

    def join(self, rows) -> None:
        """Rows joining the decode batch bring their slots' states into it."""
        self.decode.join([self.pool.take(self.slots.slot(r.request_id)) for r in rows])

    def keep(self, rows: list[int]) -> None:
        self.decode.keep(rows)

    def rows_caches(self, requests) -> list[ArraysCache]:
        """One `ArraysCache` per state layer holding the requests' slot states, in order."""
        per_row = [self.pool.caches(self.slots.slot(r.request_id)) for r in requests]
        if len(per_row) == 1:
            return per_row[0]
        return [
            arrays_cache([mx.concatenate(parts) for parts in zip(*(c.cache for c in layer))])
            for layer in zip(*per_row)
        ]

    def store_rows(self, requests, caches: list[ArraysCache]) -> None:
        """Each request's slot keeps its row of what the forward left in `caches`."""
        if len(requests) == 1:
            self.pool.store(self.slots.slot(requests[0].request_id), caches)
            return
        for i, r in enumerate(requests):
            rows = [arrays_cache([a[i : i + 1] for a in c.cache]) for c in caches]
            self.pool.store(self.slots.slot(r.request_id), rows)

    def snapshot(self, request, num_tokens: int) -> None:
        """Keep the request's state after `num_tokens` tokens for the prefix cache (a second
        reference to its arrays), where the manager wants one."""
        slot = self.kv.save_state_snapshot(request, num_tokens)
        if slot is not None:
            self.pool.fill([(slot, self.slots.slot(request.request_id))])

    def row_states(self, requests) -> list:
        """The prefilling requests' slot states, to evaluate after their forwards."""
        return [self.pool.states[self.slots.slot(r.request_id)] for r in requests]


class Segment(NamedTuple):
    """Positions `start...end` of a request's prompt run in one forward; `snapshot`: keep the
    state after them for the prefix cache."""

    request: object
    start: int
    end: int
    snapshot: bool


def prefill_segments(prefill, block_size: int) -> Iterator[list[Segment]]:
    """The forwards of a step's chunks `(request, tokens)` on a hybrid.

    A recurrence runs its forward's tokens one after another, so a forward costs about its
    length whatever its rows (mlx-lm's ops fallback loops over them). Every chunk is therefore
    cut at the same offsets from its own start: the union of every chunk's end and of its
    prompt's last two block boundaries before the last token, where snapshots are kept (two,
    because a chat's next turn shares the prompt but for its generation prompt). Each forward
    then runs every chunk not yet done, and the step costs its longest chunk."""
    chunks = []
    for r, n in prefill:
        start = r.num_computed_tokens - n
        last = (r.num_prefill_tokens - 1) // block_size * block_size
        keep = {p for p in (last - block_size, last) if p > 0 and start < p <= start + n}
        chunks.append((r, start, n, keep))
    cuts = sorted({n for _, _, n, _ in chunks} | {p - s for _, s, _, keep in chunks for p in keep})
    for lo, hi in zip([0, *cuts], cuts):
        yield [Segment(r, s + lo, s + hi, s + hi in keep) for r, s, n, keep in chunks if n > lo]
