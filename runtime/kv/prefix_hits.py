"""The prefix-cache lookup across KV cache groups: how much of a request's prompt is already
cached, per group, the way vLLM's hybrid KV cache manager looks it up.

The full-attention group needs every block from the start; a sliding-window group only the
blocks its window sees from where the hit ends (the rest stay null); a hybrid's recurrent state
needs a snapshot exactly there. The hit is the longest prefix on which they all agree.
"""

from __future__ import annotations

import math

from mlx_paged.kv.block_pool import BlockPool
from mlx_paged.kv.kv_cache_utils import BlockHash, KVCacheBlock


def group_key(group: int, block_hash: BlockHash):
    """What a group's block is cached under: its hash, with the group beyond group 0."""
    return block_hash if group == 0 else (group, block_hash)


def first_visible_block(position: int, window: int | None, block_size: int) -> int:
    """The first block a query at `position` or later can see through `window`."""
    if window is None:
        return 0
    return max(position - window + 1, 0) // block_size


def longest_hit(
    pool: BlockPool,
    hashes: list[BlockHash],
    windows: tuple,
    block_size: int,
    scales: tuple[int, ...],
    state_slots=None,
) -> tuple[list[list[KVCacheBlock]], int]:
    """Per group the blocks of the longest prefix of `hashes` (a request's candidate pages of
    `block_size` tokens) cached in every group and, with `state_slots`, ending at a state
    snapshot; and the tokens it holds. Group g's blocks hold `scales[g]` pages: a hit ends where
    every group's blocks do."""
    step = math.lcm(*scales)
    full = []  # the full group's cached blocks from the start
    for end in range(scales[0], len(hashes) + 1, scales[0]):
        block = pool.get_cached_block(hashes[end - 1])
        if block is None:
            break
        full.append(block)
    for n in range(len(full) * scales[0] // step * step, 0, -step):
        if state_slots is not None and not state_slots.has_snapshot(hashes[n - 1]):
            continue
        hits = _hits_at(pool, hashes, windows, block_size, scales, full[: n // scales[0]], n)
        if hits is not None:
            return hits, n * block_size
    return [[] for _ in windows], 0


def _hits_at(pool, hashes, windows, block_size: int, scales, full: list[KVCacheBlock], n: int):
    """Per group the blocks of a hit of `n` pages, or None where a window group lacks one its
    window sees."""
    hits = [full]
    for g, window in enumerate(windows[1:], start=1):
        scale = scales[g]
        first = first_visible_block(n * block_size, window, scale * block_size)
        keys = [group_key(g, hashes[(i + 1) * scale - 1]) for i in range(first, n // scale)]
        blocks = [pool.get_cached_block(key) for key in keys]
        if any(b is None for b in blocks):
            return None
        hits.append([pool.null_block] * first + blocks)
    return hits
