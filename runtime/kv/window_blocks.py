"""What a sliding-window KV cache group does with its blocks (`kv_groups.py`): it takes a
prompt's blocks chunk by chunk and gives back the blocks its window has passed, so a request's
memory in a window group stops growing at about window / block size blocks."""

from __future__ import annotations

from mlx_paged.kv.prefix_hits import first_visible_block


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class SlidingWindowBlocks:
    """`KVCacheManager`'s window-group part; it reads the manager's `req_to_blocks`,
    `num_freed`, `block_pool`, `group_windows` and `group_block_sizes`."""

    def allocate_chunk(self, request, num_tokens: int) -> bool:
        """Room in the window groups for the prompt's next `num_tokens` (the full group holds
        the whole prompt from admission), after freeing what their windows left; False if the
        pool cannot hold them (nothing taken)."""
        groups = self.req_to_blocks.get(request.request_id)
        if groups is None or len(groups) == 1:
            return True
        self._free_out_of_window(request, groups, request.num_computed_tokens)
        end = request.num_computed_tokens + num_tokens
        wanted = [
            max(cdiv(end, size) - len(group), 0)
            for group, size in zip(groups[1:], self.group_block_sizes[1:])
        ]
        if sum(wanted) > self.block_pool.num_free_blocks:
            return False
        for group, n in zip(groups[1:], wanted):
            group.extend(self.block_pool.get_new_blocks(n))
        return True

    def _free_out_of_window(self, request, groups, num_computed: int) -> None:
        freed = self.num_freed.setdefault(request.request_id, [0] * len(groups))
        # The next query sits at `num_computed`, or one before it where a decode step has
        # counted the token it feeds.
        position = max(num_computed - 1, 0)
        for g, window in enumerate(self.group_windows):
            if window is None:
                continue
            first = first_visible_block(position, window, self.group_block_sizes[g])
            blocks, end = groups[g], min(first, len(groups[g]))
            gone = blocks[freed[g] : end]
            self.block_pool.free_blocks(list(reversed(gone)))
            blocks[freed[g] : end] = [self.block_pool.null_block] * len(gone)
            freed[g] = max(freed[g], end)
