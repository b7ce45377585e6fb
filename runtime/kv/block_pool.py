"""The shared pool of KV blocks: allocation from the free queue, reference counts, and the
hash -> block map of automatic prefix caching with lazy LRU eviction."""

from __future__ import annotations

from collections.abc import Sequence

from mlx_paged.kv.kv_cache_utils import BlockHash, FreeKVCacheBlockQueue, KVCacheBlock


class BlockPool:
    """`num_blocks` blocks; block 0 is the null block (padding in block tables), never handed out.

    A freed block keeps its hash until it is handed out again, so a later request with the same
    prefix can revive it (`touch`) instead of recomputing it.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.cached_block_hash_to_block: dict[BlockHash, KVCacheBlock] = {}
        # Free blocks that still carry a hash, kept current so metrics never walk the queue.
        self.num_cached_free_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        if not self.enable_caching:
            return None
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` from the front of the free queue (evicting their old hashes)."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"asked for {num_blocks} blocks, {self.num_free_blocks} are free")
        out = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def _evict(self, block: KVCacheBlock) -> None:
        """Forget a free block's hash (it is being reused or the cache is reset)."""
        if block.block_hash is not None:
            self.num_cached_free_blocks -= 1
            if self.cached_block_hash_to_block.get(block.block_hash) is block:
                del self.cached_block_hash_to_block[block.block_hash]
            block.block_hash = None

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; a free one leaves the free queue."""
        for block in blocks:
            if block.is_null:  # a window group's hit starts with null blocks: nobody owns them
                continue
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
                self.num_cached_free_blocks -= block.block_hash is not None
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Sequence[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching 0 join the back of the free queue in the
        given order (callers pass a request's blocks tail first, so tails are evicted first)."""
        for block in ordered_blocks:
            if block.is_null:
                continue
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)
                self.num_cached_free_blocks += block.block_hash is not None

    def cache_full_block(self, block: KVCacheBlock, block_hash: BlockHash) -> None:
        """Register a block that just became full under its content hash."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        # A duplicate of an already-cached block stays private: block tables are append-only.
        self.cached_block_hash_to_block.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            if block.ref_cnt == 0:
                self._evict(block)
