"""Slots of the recurrent-state pool: one per running request, the rest holding prefix-cache
snapshots (a request's state at a block boundary, keyed by the hash of the blocks before it).

Pure bookkeeping: the arrays live in `StatePool`, which the runner updates from `pending` (slots
to fill before they are read) in the order the slots were handed out.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from mlx_paged.kv.kv_cache_utils import BlockHash


class StateSlots:
    """`num_slots` slots; slot 0 is never handed out (slot numbers start at 1).

    A snapshot's slot goes back to use when a running request needs one and none is free, the
    least recently used snapshot first.

    Args:
        num_slots: slots in the pool, the unused slot 0 included.
        enable_caching: keep snapshots for the prefix cache.
    """

    def __init__(self, num_slots: int, enable_caching: bool = True):
        if num_slots < 2:
            raise ValueError(f"num_slots must be >= 2 (slot 0 is never used), got {num_slots}")
        self.num_slots = num_slots
        self.enable_caching = enable_caching
        self.free: deque[int] = deque(range(1, num_slots))
        self.req_to_slot: dict[str, int] = {}
        self.snapshots: OrderedDict[BlockHash, int] = OrderedDict()  # least recent first
        # (slot, source slot or None for zeros), in the order the slots were handed out.
        self.pending: list[tuple[int, int | None]] = []

    @property
    def num_available(self) -> int:
        """Slots a request could take: free ones and ones holding snapshots."""
        return len(self.free) + len(self.snapshots)

    @property
    def num_in_use(self) -> int:
        return self.num_slots - 1 - len(self.free)

    def has_snapshot(self, block_hash: BlockHash) -> bool:
        return self.enable_caching and block_hash in self.snapshots

    def allocate(self, request_id: str, restore: BlockHash | None = None) -> int:
        """A slot for `request_id`, to start from the snapshot at `restore` (zeros for None)."""
        if request_id in self.req_to_slot:
            raise RuntimeError(f"{request_id} already holds a state slot")
        source = self.snapshots.get(restore) if restore is not None else None
        if source is not None:
            self.snapshots.move_to_end(restore)  # evicted last, so the copy reads it intact
        slot = self._take()
        if slot is None:
            raise ValueError("no state slot is free; check num_available before allocating")
        self.req_to_slot[request_id] = slot
        if source != slot:  # the snapshot itself may be the last slot left: then it is the state
            self.pending.append((slot, source))
        return slot

    def _take(self) -> int | None:
        if self.free:
            return self.free.popleft()
        if self.snapshots:
            return self.snapshots.popitem(last=False)[1]
        return None

    def save_snapshot(self, block_hash: BlockHash) -> int | None:
        """A slot to copy a request's state into, as the snapshot at `block_hash`; None when
        caching is off, the snapshot exists already (it becomes the most recent) or no slot is
        free or held by an older snapshot."""
        if not self.enable_caching:
            return None
        if block_hash in self.snapshots:
            self.snapshots.move_to_end(block_hash)
            return None
        slot = self._take()
        if slot is not None:
            self.snapshots[block_hash] = slot
        return slot

    def free_slot(self, request_id: str) -> None:
        """Return the request's slot (finished, aborted or preempted)."""
        slot = self.req_to_slot.pop(request_id, None)
        if slot is None:
            return
        self.pending = [p for p in self.pending if p[0] != slot]
        self.free.append(slot)

    def slot(self, request_id: str) -> int:
        return self.req_to_slot[request_id]

    def take_pending(self) -> list[tuple[int, int | None]]:
        """The slot fills owed since the last call, in order; the caller performs them."""
        pending, self.pending = self.pending, []
        return pending

    def reset_snapshots(self) -> None:
        """Forget every snapshot (the pool's contents were lost)."""
        self.free.extend(self.snapshots.values())
        self.snapshots.clear()
