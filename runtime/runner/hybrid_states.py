"""Where a hybrid model's recurrent state lives while the paged runner works: in its request's
state slot while the prompt is prefilled (`StatePool`), then in the decode batch
(`DecodeStates`) from the step the request joins it until it leaves."""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache

from mlx_paged.kv.kv_cache_manager import KVCacheManager
from mlx_paged.kv.state_pool import StatePool
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

    def row_caches(self, request) -> list[ArraysCache]:
        return self.pool.caches(self.slots.slot(request.request_id))

    def store_row(self, request, caches: list[ArraysCache]) -> None:
        self.pool.store(self.slots.slot(request.request_id), caches)

    def snapshot(self, request, num_tokens: int) -> None:
        """Keep the request's state after `num_tokens` tokens for the prefix cache (a second
        reference to its arrays), where the manager wants one."""
        slot = self.kv.save_state_snapshot(request, num_tokens)
        if slot is not None:
            self.pool.fill([(slot, self.slots.slot(request.request_id))])

    def written(self) -> list:
        """The arrays forwards produce, to evaluate with a step."""
        return [self.decode.arrays, list(self.pool.states.values())]
