"""Per-request block tables over the shared `BlockPool`, with automatic prefix caching.

The scheduler talks to this class only: `get_computed_blocks` (prefix-cache lookup),
`allocate_slots` (make room for new tokens or say it cannot), `free`, and `get_block_ids`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from mlx_paged.kv.block_pool import BlockPool
from mlx_paged.kv.kv_cache_utils import (
    BlockHash,
    KVCacheBlock,
    PagedRequest,
    hash_request_blocks,
)
from mlx_paged.kv.prefix_hits import group_key, longest_hit
from mlx_paged.kv.state_slots import StateSlots
from mlx_paged.kv.window_blocks import SlidingWindowBlocks, cdiv


class KVCacheManager(SlidingWindowBlocks):
    """Owns the block table of every running request.

    Args:
        num_blocks: pool size, the null block included.
        block_size: tokens per block.
        enable_caching: automatic prefix caching (`--no-prefix-caching` turns it off).
        state_slots: the recurrent-state slots of a hybrid model (None: attention only). Each
            request then holds a slot too, and a prefix hit needs a state snapshot where it ends.
        group_windows: per KV cache group (`kv_groups.py`), its sliding window, None for full
            attention. A request holds a block table per group; a window group frees the blocks
            no later query can see, and a prefix hit needs its window's blocks still cached.
        group_scales: per group, how many pages of `block_size` tokens one of its blocks holds
            (`KVCacheGroups.page_scale`; default 1 each): its block size is that many times
            `block_size`, and prefix hits end where every group's blocks do.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        state_slots: StateSlots | None = None,
        group_windows: tuple[int | None, ...] = (None,),
        group_scales: tuple[int, ...] = (),
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.group_scales = group_scales or (1,) * len(group_windows)
        # Per group, tokens per block.
        self.group_block_sizes = tuple(s * block_size for s in self.group_scales)
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.group_windows = group_windows
        # Per request, per group, its blocks; a window group's freed ones are the null block.
        self.req_to_blocks: dict[str, list[list[KVCacheBlock]]] = {}
        # Per request, per group, how many leading blocks the window has already left.
        self.num_freed: dict[str, list[int]] = {}
        self.req_to_block_hashes: dict[str, list[BlockHash]] = {}
        # Per request, per group, how many leading blocks are registered in the prefix cache.
        self.num_cached_block: dict[str, list[int]] = {}
        self.state_slots = state_slots

    @property
    def max_request_tokens(self) -> int:
        """The most tokens one request can hold with a block spare (admission keeps one) where
        every group holds blocks for all of them: a bound that always fits."""
        step = math.lcm(*self.group_scales)  # pages after which every group's blocks end
        blocks = sum(step // s for s in self.group_scales)
        return (self.block_pool.num_usable_blocks - 1) // blocks * step * self.block_size

    def _block_hashes(self, request: PagedRequest) -> list[BlockHash]:
        """The request's full-block hashes, extended incrementally as tokens arrive."""
        hashes = self.req_to_block_hashes.setdefault(request.request_id, [])
        if request.num_prefill_tokens // self.block_size > len(hashes):
            # Only the tokens past the hashed blocks are copied: decode adds a block at a time.
            tail = request.token_id_range(len(hashes) * self.block_size)
            hashes += hash_request_blocks(
                tail, self.block_size, parent=hashes[-1] if hashes else None
            )
        return hashes

    def get_computed_blocks(self, request: PagedRequest) -> tuple[list[list[KVCacheBlock]], int]:
        """Longest cached prefix of the request (`prefix_hits.longest_hit`), short of its last
        token, which must be computed to get logits.

        Returns:
            (per group the hit blocks, the null block where a window needs none; tokens held).
        """
        if not self.enable_caching:
            return [[] for _ in self.group_windows], 0
        max_blocks = (request.num_prefill_tokens - 1) // self.block_size
        hashes = self._block_hashes(request)[:max_blocks]
        return longest_hit(self.block_pool, hashes, self.group_windows, self.block_size,
                           self.group_scales, self.state_slots)  # fmt: skip

    def num_blocks_needed(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] = (),
        window_tokens: int | None = None,
    ) -> int:
        """New blocks `allocate_slots` would take from the free queue for this request."""
        held = self.req_to_blocks.get(request.request_id)
        hits = list(new_computed_blocks) or [[] for _ in self.group_windows]
        start = request.num_computed_tokens + len(hits[0]) * self.group_block_sizes[0]
        needed = 0
        for g, group_hits in enumerate(hits):
            new = num_new_tokens if g == 0 or window_tokens is None else window_tokens
            blocks = cdiv(start + new, self.group_block_sizes[g])
            have = len(held[g]) if held else 0
            # Reviving a free cached block takes it off the free queue too.
            revived = sum(1 for b in group_hits if b.ref_cnt == 0 and not b.is_null)
            needed += max(blocks - have - len(group_hits), 0) + revived
        return needed

    def can_allocate(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] = (),
        num_reserved_blocks: int = 0,
        window_tokens: int | None = None,
    ) -> bool:
        needed = self.num_blocks_needed(request, num_new_tokens, new_computed_blocks, window_tokens)
        return needed + num_reserved_blocks <= self.block_pool.num_free_blocks

    def allocate_slots(
        self,
        request: PagedRequest,
        num_new_tokens: int,
        new_computed_blocks: Sequence[Sequence[KVCacheBlock]] = (),
        window_tokens: int | None = None,
    ) -> list[KVCacheBlock] | None:
        """Give the request room for `num_new_tokens` more tokens after its computed ones.

        Args:
            request: the request; `num_computed_tokens` excludes `new_computed_blocks`.
            num_new_tokens: tokens to compute this step.
            new_computed_blocks: prefix-cache hits from `get_computed_blocks` (first call only).
            window_tokens: the window groups' room, if not `num_new_tokens` (a prompt's
                window blocks are taken chunk by chunk: `allocate_chunk`).

        Returns:
            The newly allocated blocks, group after group, or None when the pool cannot hold
            them (nothing changes).
        """
        if num_new_tokens < 1:
            raise ValueError("num_new_tokens must be >= 1")
        if not self.can_allocate(request, num_new_tokens, new_computed_blocks, 0, window_tokens):
            return None
        groups = self._groups(request)
        hits = list(new_computed_blocks)
        if any(hits):
            for blocks, group_hits in zip(groups, hits):
                self.block_pool.touch(group_hits)
                blocks.extend(group_hits)
            self.num_cached_block[request.request_id] = [len(h) for h in hits]
        start = request.num_computed_tokens + (
            len(hits[0]) * self.group_block_sizes[0] if hits else 0
        )
        new_blocks = []
        for g, blocks in enumerate(groups):
            num_tokens = start + (
                num_new_tokens if g == 0 or window_tokens is None else window_tokens
            )
            new = self.block_pool.get_new_blocks(
                max(cdiv(num_tokens, self.group_block_sizes[g]) - len(blocks), 0)
            )
            blocks.extend(new)
            new_blocks += new
        return new_blocks

    def _groups(self, request: PagedRequest) -> list[list[KVCacheBlock]]:
        return self.req_to_blocks.setdefault(request.request_id, [[] for _ in self.group_windows])

    def cache_blocks(self, request: PagedRequest, num_computed_tokens: int) -> None:
        """Register the blocks that `num_computed_tokens` computed tokens have filled (at most
        the request's known tokens: a decode step's fed token is known only after the step),
        then free the window groups' blocks that no query from there on can see."""
        groups = self.req_to_blocks.get(request.request_id)
        if not groups:
            return
        if self.enable_caching:
            self._cache_full_blocks(request, groups, num_computed_tokens)
        self._free_out_of_window(request, groups, num_computed_tokens)

    def _cache_full_blocks(self, request, groups, num_computed_tokens: int) -> None:
        num_tokens = min(num_computed_tokens, request.num_prefill_tokens)
        cached = self.num_cached_block.setdefault(request.request_id, [0] * len(groups))
        hashes = None
        for g, blocks in enumerate(groups):
            scale = self.group_scales[g]
            num_full = min(num_tokens // self.group_block_sizes[g], len(blocks))
            if num_full <= cached[g]:
                continue
            hashes = hashes or self._block_hashes(request)
            # A block of several pages is cached under the hash of its last page.
            for i in range(cached[g], num_full):
                if not blocks[i].is_null:
                    key = group_key(g, hashes[(i + 1) * scale - 1])
                    self.block_pool.cache_full_block(blocks[i], key)
            cached[g] = num_full

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
        for blocks in self.req_to_blocks.pop(request.request_id, []):
            self.block_pool.free_blocks(list(reversed(blocks)))
        self.num_freed.pop(request.request_id, None)
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
        # A window group's prompt blocks are taken chunk by chunk (`allocate_chunk`).
        if not self.can_allocate(request, num_new, hits, num_reserved_blocks=1, window_tokens=0):
            return False
        self.allocate_slots(request, num_new, hits, window_tokens=0)
        if slots is not None:
            restore = (
                self._block_hashes(request)[num_hit // self.block_size - 1] if num_hit else None
            )
            slots.allocate(request.request_id, restore)
        request.num_computed_tokens = num_hit
        if not request.output_token_ids:  # a resumed request's hit may cover its own output
            request.num_cached_tokens = num_hit
        return True

    def allocate_decode(self, request) -> bool:
        """Room for the token a decode step feeds (`allocate_slots(request, 1)`). A block the
        previous steps filled is cached first, so decoded text is a prefix like any prompt."""
        num_computed = request.num_computed_tokens
        if num_computed % self.block_size == 0:
            self.cache_blocks(request, num_computed)
        groups, sizes = self.req_to_blocks.get(request.request_id), self.group_block_sizes
        # Most steps: the token's slot is in a block the request holds, and nothing changes.
        if groups and num_computed < (
            len(groups[0]) * sizes[0]
            if len(groups) == 1
            else min(len(blocks) * size for blocks, size in zip(groups, sizes))
        ):
            return True
        return self.allocate_slots(request, 1) is not None

    def trim(self, request: PagedRequest, num_tokens: int) -> None:
        """Free the request's blocks past its first `num_tokens` tokens (the K/V written for
        rejected speculative drafts; none of them was hashed), in place, tail first."""
        groups = self.req_to_blocks.get(request.request_id, [])
        for blocks, size in zip(groups, self.group_block_sizes):
            keep = cdiv(num_tokens, size)
            if len(blocks) > keep:
                self.block_pool.free_blocks(list(reversed(blocks[keep:])))
                del blocks[keep:]

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

    def get_blocks(self, request: PagedRequest, group: int = 0) -> list[KVCacheBlock]:
        """The request's blocks in `group`: the manager's own list, which grows in place while
        the request runs (callers read it, never change it)."""
        return self._groups(request)[group]

    def get_block_ids(self, request: PagedRequest, group: int = 0) -> list[int]:
        groups = self.req_to_blocks.get(request.request_id)
        return [b.block_id for b in groups[group]] if groups else []
