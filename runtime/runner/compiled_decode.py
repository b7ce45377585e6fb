"""The paged decode forward traced once per input shape with `mx.compile`, then replayed.

A replay skips building the model's graph in Python and fuses its elementwise chains. Shapes
repeat because the runner pads the batch and the block tables to powers of two
(`block_table.bucket`), so a server traces a handful of shapes and then only replays.

The pages go in and come out of the traced function (the page writes stay scatters that reuse
the pool's buffers), and so do the fused split-K kernel's partition counters, which chain from
call to call. A hybrid's decode-batch state goes in and comes out the same way.
"""

from __future__ import annotations

from collections import Counter

import mlx.core as mx

from mlx_paged.kv.page_arrays import SlotMapping
from mlx_paged.kv.paged_cache import PagedAttentionMetadata, PagedKVPool
from mlx_paged.runner.hybrid_states import HybridStates


class CompiledDecode:
    """`forward(tokens, meta) -> logits` of one decode step, through a compiled trace.

    Args:
        forward: the eager forward, `(tokens (B, 1), meta) -> logits (B, 1, V)`, writing the
            pool's pages.
        pool: the pool whose pages `forward` reads and writes.
        states: a hybrid's recurrent state, whose decode batch `forward` advances, else None.
    """

    def __init__(self, forward, pool: PagedKVPool, states: HybridStates | None = None):
        self._forward = forward
        self.pool = pool
        self.states = states
        self._compiled = mx.compile(self._traced)
        # Attention calls one step adds to `pool.attention_calls`: the hook counts them while
        # tracing only, so replays add what the last trace counted.
        self._calls_per_step: Counter = Counter()
        self._traced_now = False

    def __call__(self, tokens: mx.array, metas: list[PagedAttentionMetadata]) -> mx.array:
        """Logits of a decode step whose KV cache groups read `metas` (one each)."""
        pool, meta = self.pool, metas[0]
        pages = list(pool.pages)
        decode = self.states.decode if self.states is not None else None
        states = list(decode.arrays) if decode is not None else []
        hybrid = (states,) if decode is not None else ()
        groups = meta.block_tables.shape[0] * pool.max_kv_heads
        counters = pool.counters.reserve(groups)
        self._traced_now = False
        try:
            logits, counters_next, new_pages, new_states = self._compiled(
                tokens, [m.block_tables for m in metas], meta.context_lens,
                [m.slot_mapping.slots for m in metas], counters, pages, *hybrid,
            )  # fmt: skip
        except BaseException:  # a failed trace left tracers in the pool and the counter chain
            pool.pages[:] = pages
            if decode is not None:
                decode.arrays = states
            pool.counters.replace(counters)
            raise
        if not self._traced_now:  # a replay: the hook did not run, so count for it
            pool.attention_calls.update(self._calls_per_step)
        pool.counters.replace(counters_next)
        pool.pages[:] = new_pages
        if decode is not None:
            decode.arrays = new_states
        return logits

    def _traced(self, tokens, block_tables, context_lens, slot_mapping, counters, pages, states=()):
        pool = self.pool
        pool.pages[:] = pages
        if self.states is not None:
            self.states.decode.arrays = states
        pool.counters.replace(counters)
        before = Counter(pool.attention_calls)
        metas = [
            PagedAttentionMetadata(
                block_tables=tables,
                context_lens=context_lens,
                offsets=context_lens - 1,
                slot_mapping=SlotMapping(slots),
                num_query_tokens=1,
                rope_in_attention=pool.rope_inv_freq is not None,
            )
            for tables, slots in zip(block_tables, slot_mapping)
        ]
        logits = self._forward(tokens, metas)
        self._calls_per_step = pool.attention_calls - before
        self._traced_now = True
        states = self.states.decode.arrays if self.states is not None else []
        return logits, pool.counters.reserve(0), list(pool.pages), states
