"""Block-level building blocks of the paged KV cache: the block, the O(1) free queue and the
chained content hash used for automatic prefix caching (vLLM v1's design and names)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NewType, Protocol

BlockHash = NewType("BlockHash", bytes)


class PagedRequest(Protocol):
    """What the KV cache manager reads of a request."""

    request_id: str
    num_computed_tokens: int
    num_prefill_tokens: int  # its prompt and output tokens

    def token_id_range(self, start: int, stop: int | None = None) -> Sequence[int]: ...


# The parent of a request's first block: a fixed root, so equal prefixes hash equally.
ROOT_HASH = BlockHash(hashlib.sha256(b"mlx-paged/root").digest())


def hash_block_tokens(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple = ()
) -> BlockHash:
    """Hash one full block, chained through its parent's hash.

    Args:
        parent: the previous block's hash (None for the first block of a sequence).
        token_ids: the block's tokens.
        extra_keys: what else makes K/V differ for equal tokens (adapter, cache salt).
    """
    h = hashlib.sha256(parent or ROOT_HASH)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return BlockHash(h.digest())


def hash_request_blocks(
    token_ids: Sequence[int],
    block_size: int,
    start: int = 0,
    parent: BlockHash | None = None,
    extra_keys: tuple = (),
) -> list[BlockHash]:
    """Hashes of the full blocks of `token_ids` from block index `start` on."""
    hashes = []
    for i in range(start, len(token_ids) // block_size):
        parent = hash_block_tokens(
            parent, token_ids[i * block_size : (i + 1) * block_size], extra_keys
        )
        hashes.append(parent)
    return hashes


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One page of the pool; links thread it through the free queue while `ref_cnt` is 0."""

    block_id: int
    ref_cnt: int = 0
    block_hash: BlockHash | None = None
    prev_free_block: KVCacheBlock | None = None
    next_free_block: KVCacheBlock | None = None
    is_null: bool = False

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks with sentinel ends: O(1) popleft, append and remove.

    The front is the least recently freed block, the next to be evicted; a prefix-cache hit on a
    free block takes it out of the middle in O(1).
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("no free blocks")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is None or block.next_free_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """Front to back; for tests and metrics."""
        out, block = [], self._head.next_free_block
        while block is not self._tail:
            out.append(block)
            block = block.next_free_block
        return out
