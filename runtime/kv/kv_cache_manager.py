"""Per-request block tables over the shared `BlockPool`, with automatic prefix caching.

The scheduler talks to this class only: `get_computed_blocks` (prefix-cache lookup),
`allocate_slots` (make room for new tokens or say it cannot), `free`, and `get_block_ids`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from mlx_paged.kv.block_pool import BlockPool
from mlx_paged.kv.kv_cache_utils import BlockHash, KVCacheBlock, hash_request_blocks
from mlx_paged.kv.state_slots import StateSlots


class PagedRequest(Protocol):
    request_id: str
    num_computed_tokens: int

    @property
    def all_token_ids(self) -> Sequence[int]: ...


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    """Owns the block table of every running request.

    Args:
        num_blocks: pool size, the null block included.
        block_size: tokens per block.
        enable_caching: automatic prefix caching (`--no-prefix-caching` turns it off).
        state_slots: the recurrent-state slots of a hybrid model (None: attention only). Each
            request then holds a slot too, and a prefix hit needs a state snapshot where it ends.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        state_slots: StateSlots | None = None,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.state_slots = state_slots

    def _block_hashes(self, request: PagedRequest) -> list[BlockHash]:
        """The request's full-block hashes, extended incrementally as tokens arrive."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        tokens = request.all_token_ids
        if len(tokens) // self.block_size > len(hashes):
            hashes += hash_request_blocks(
                tokens, self.block_size, start=len(hashes), parent=hashes[-1] if hashes else None
            )
        return hashes

    def get_computed_blocks(self, request: PagedRequest) -> tuple[list[KVCacheBlock], int]:
        """Longest run of cached full blocks at the start of the request.

        The hit stops short of the last token, which must be computed to get logits.

        Returns:
            (blocks, number of tokens they hold).
        """
        if not self.enable_caching:
            return [], 0
        max_blocks = (len(request.all_token_ids) - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(request)[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        if self.state_slots is not None:  # the hit ends where a state snapshot was kept
            hashes = self.req_to_block_hashes[request.request_id]
            while hits and not self.state_slots.has_snapshot(hashes[len(hits) - 1]):
                hits.pop()
        return hits, len(hits) * self.block_size

    def num_blocks_needed(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> int:
        """New blocks `allocate_slots` would take from the free queue for this request."""
        held = len(self.req_to_blocks.get(request.request_id, ())) + len(new_computed_blocks)
        num_tokens = (
            request.num_computed_tokens
            + len(new_computed_blocks) * self.block_size
            + num_new_tokens
        )
        # Reviving a free cached block takes it off the free queue too.
        revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        return max(cdiv(num_tokens, self.block_size) - held, 0) + revived

    def can_allocate(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
        num_reserved_blocks: int = 0,
    ) -> bool:
        needed = self.num_blocks_needed(request, num_new_tokens, new_computed_blocks)
        return needed + num_reserved_blocks <= self.block_pool.num_free_blocks

    def allocate_slots(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock] = (),
    ) -> list[KVCacheBlock] | None:
        """Give the request room for `num_new_tokens` more tokens after its computed ones.

        Args:
            request: the request; `num_computed_tokens` excludes `new_computed_blocks`.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: prefix-cache hits from `get_computed_blocks` (first call only).

        Returns:
            The newly allocated blocks, or None when the pool cannot hold them (nothing changes).
        """
        if num_new_tokens < 1:
            raise ValueError("num_new_tokens must be >= 1")
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks):
            return None
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_block[request.request_id] = len(blocks)
        num_tokens = (
            request.num_computed_tokens
            + len(new_computed_blocks) * self.block_size
            + num_new_tokens
        )
        new_blocks = self.block_pool.get_new_blocks(
            max(cdiv(num_tokens, self.block_size) - len(blocks), 0)
        )
        blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: PagedRequest, num_computed_tokens: int) -> None:
        """Register the blocks that `num_computed_tokens` computed tokens have filled (at most
        the request's known tokens: a decode step's fed token is known only after the step)."""
        if not self.enable_caching:
            return
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_tokens = min(num_computed_tokens, len(request.all_token_ids))
        num_full = min(num_tokens // self.block_size, len(blocks))
        start = self.num_cached_block.get(request.request_id, 0)
        if num_full <= start:
            return
        hashes = self._block_hashes(request)
        for i in range(start, num_full):
            self.block_pool.cache_full_block(blocks[i], hashes[i])
        self.num_cached_block[request.request_id] = num_full

    def free(self, request: PagedRequest, cache_computed: bool = False) -> None:
        """Release the request's blocks, tail first, so its most specific blocks go first.

        `cache_computed`: first register the full blocks of its known tokens, so a later request
        (the conversation's next turn, or this one resumed) hits them. Only for a request that
        was decoding: its prompt and every known output token have their K/V written or queued.
        """
        if cache_computed:
            self.cache_blocks(request, request.num_computed_tokens)
        if self.state_slots is not None:
            self.state_slots.free_slot(request.request_id)
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(list(reversed(blocks)))
        self.num_cached_block.pop(request.request_id, None)
        self.req_to_block_hashes.pop(request.request_id, None)

    # ---- the scheduler's KVSpace protocol ------------------------------------------------------

    def admit(self, request) -> bool:
        """Allocate a waiting request's prefill, reusing cached prefix blocks; keeps one block
        spare so running requests are not starved by admissions."""
        slots = self.state_slots
        if slots is not None and slots.num_available == 0:
            return False
        hits, num_hit = self.get_computed_blocks(request)
        num_new = request.num_prefill_tokens - num_hit
        if not self.can_allocate(request, num_new, hits, num_reserved_blocks=1):
            return False
        self.allocate_slots(request, num_new, hits)
        if slots is not None:
            restore = self._block_hashes(request)[len(hits) - 1] if hits else None
            slots.allocate(request.request_id, restore)
        request.num_computed_tokens = num_hit
        if not request.output_token_ids:  # a resumed request's hit may cover its own output
            request.num_cached_tokens = num_hit
        return True

    def allocate_decode(self, request) -> bool:
        """Room for the token a decode step feeds (`allocate_slots(request, 1)`). A block the
        previous steps filled is cached first, so decoded text is a prefix like any prompt."""
        if request.num_computed_tokens % self.block_size == 0:
            self.cache_blocks(request, request.num_computed_tokens)
        blocks = self.req_to_blocks.get(request.request_id)
        # Most steps: the token's slot is in a block the request holds, and nothing changes.
        if blocks and request.num_computed_tokens < len(blocks) * self.block_size:
            return True
        return self.allocate_slots(request, 1) is not None

    def save_state_snapshot(self, request: PagedRequest, num_tokens: int) -> int | None:
        """A slot for the request's state after its first `num_tokens` tokens (a multiple of
        the block size), kept for the prefix cache; None when none is to be kept."""
        if self.state_slots is None or not self.enable_caching:
            return None
        hashes = self._block_hashes(request)
        return self.state_slots.save_snapshot(hashes[num_tokens // self.block_size - 1])

    def reset_prefix_cache(self) -> None:
        """Forget every cached block and state snapshot (the pool's contents were lost)."""
        self.block_pool.reset_prefix_cache()
        if self.state_slots is not None:
            self.state_slots.reset_snapshots()

    def get_blocks(self, request: PagedRequest) -> list[KVCacheBlock]:
        """The request's blocks: the manager's own list, which grows in place while the request
        runs (callers read it, never change it)."""
        return self.req_to_blocks.setdefault(request.request_id, [])

    def get_block_ids(self, request: PagedRequest) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request.request_id, [])]
