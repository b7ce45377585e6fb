"""The paged KV path: every row's K/V lives in blocks of one shared pool, addressed through its
block table, so joining and leaving a batch copy nothing and rows carry no padding in the cache.

Decode is pipelined as in the contiguous runner: a decode forward feeds the tokens sampled by
the previous one and returns them, while its own samples are computed asynchronously.
"""

from __future__ import annotations

import dataclasses
import logging

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.kernel_inputs import input_array
from mlx_paged.kv.attention_hook import forward_on
from mlx_paged.kv.cache_plan import AttentionSlot, CachePlan
from mlx_paged.kv.kv_cache_manager import KVCacheManager, cdiv
from mlx_paged.kv.paged_cache import (
    PagedAttentionMetadata,
    PagedKVPool,
    PagedLayerCache,
    split_slots,
)
from mlx_paged.kv.shape_buckets import bucket
from mlx_paged.kv.state_pool import StatePool
from mlx_paged.request import PromptSchedule, Request
from mlx_paged.runner.block_table import BlockTable
from mlx_paged.runner.compiled_decode import CompiledDecode
from mlx_paged.runner.hybrid_states import HybridStates, prefill_segments
from mlx_paged.runner.logits_head import split_logits_head
from mlx_paged.runner.model_runner import LookaheadDecoder, ModelRunner, RowOutput

logger = logging.getLogger(__name__)

# Narrowest table a compiled step is traced for, in blocks: short contexts share one trace.
MIN_COMPILED_TABLE_BLOCKS = 8


class PagedRunner(LookaheadDecoder, ModelRunner):
    """Runs the model with one `PagedLayerCache` per layer over a shared `PagedKVPool`.

    Args:
        compile_decode: replay decode steps from `mx.compile` traces (`CompiledDecode`), with
            the batch and the block tables padded to powers of two; else build each step anew.
    """

    def __init__(
        self,
        model,
        pool: PagedKVPool,
        kv: KVCacheManager,
        compile_decode=False,
        plan: CachePlan | None = None,
        states: StatePool | None = None,
    ):
        self.model = model
        self.pool = pool
        self.kv = kv
        self.plan = plan or CachePlan([AttentionSlot(i) for i in range(pool.num_layers)])
        # Recurrent state of a hybrid model, else None.
        self.states = HybridStates(states, kv) if states is not None else None
        self.block_table = BlockTable(pool.block_size)
        self.compiled_decode = (
            CompiledDecode(self._decode_logits, pool, self.states) if compile_decode else None
        )
        # The engine hands a step's prefill chunks to `decode`, to run in its forward; that
        # needs the logits head apart, so only the decode rows reach it.
        self.logits_head = split_logits_head(model)
        # A chunk's tokens run as rows of one token there, which recurrent state cannot take.
        self.mixes_prefill = self.logits_head is not None and states is None
        if self.logits_head is None:
            logger.info("prefill chunks run in forwards of their own: the model's logits head "
                        "could not be split from its body")  # fmt: skip
        self.reset()

    def reset(self) -> None:
        self.prompt_rows: list[Request] = []
        self.reset_decode()
        self.block_table.clear()
        lost_states = self.states is not None and self.states.reset()
        if self.pool.repair() or lost_states:
            self.kv.reset_prefix_cache()  # cached blocks and snapshots now hold zeros

    @property
    def kv_bytes_in_use(self) -> int:
        pool = self.kv.block_pool
        used = (pool.num_usable_blocks - pool.num_free_blocks) * self.pool.nbytes // pool.num_blocks
        return used + (self.states.bytes_in_use if self.states is not None else 0)

    def _fill_state_slots(self) -> None:
        if self.states is not None:
            self.states.fill_pending()

    def _written(self) -> list:
        """What a decode forward writes: the pages, and a hybrid's decode-batch state."""
        return [self.pool.pages, self.states.decode.arrays if self.states is not None else []]

    def _metadata(
        self, rows: list[Request], starts: list[int], counts: list[int], width: int
    ) -> PagedAttentionMetadata:
        """Rows writing `counts[b]` tokens from position `starts[b]`, padded to `width`."""
        tables = [self.kv.get_block_ids(r) for r in rows]
        max_blocks = max(len(t) for t in tables)
        slots = []
        for table, start, n in zip(tables, starts, counts):
            slots += self._slots(table, start, n)
            slots += [0] * (width - n)  # padding writes land in the null block
        return PagedAttentionMetadata(
            block_tables=input_array([t + [0] * (max_blocks - len(t)) for t in tables]),
            context_lens=input_array([s + n for s, n in zip(starts, counts)]),
            offsets=input_array(starts),
            slot_mapping=split_slots(slots, self.pool.block_size),
            num_query_tokens=width,
            # Prefill only: a start forward (one token per row) attends like a decode step.
            prefill_rows=tuple(self._prefill_row(*row) for row in zip(tables, starts, counts))
            if width > 1
            else (),
        )

    def _slots(self, table: list[int], start: int, count: int) -> list[int]:
        """Pool slots of positions `start...start + count` of a row with block ids `table`."""
        bs = self.pool.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, start + count)]

    def _prefill_row(self, table: list[int], start: int, count: int):
        """A `prefill_rows` entry: the chunk and its table trimmed to the blocks it reaches."""
        return start, count, input_array(table[: cdiv(start + count, self.pool.block_size)])

    def _decode_batch(self, padded: bool):
        """The decode rows' count, and their tables, lengths and slots for this step, with the
        rows and tables padded to the compiled steps' buckets when `padded`."""
        # The scheduler already counted the fed token: it sits at num_computed_tokens - 1.
        context_lens = np.fromiter(
            (r.num_computed_tokens for r in self.decode_rows), np.int32, len(self.decode_rows)
        )
        num_rows, width = len(context_lens), self.block_table.sync()
        if padded:
            num_rows, width = bucket(num_rows), bucket(width, MIN_COMPILED_TABLE_BLOCKS)
        return len(context_lens), *self.block_table.decode_inputs(context_lens, num_rows, width)

    def _caches(self, meta: PagedAttentionMetadata, states=()) -> list:
        """The model's caches for one forward: paged ones for `meta` and, on a hybrid, the
        `ArraysCache`s `states` (which the forward advances)."""
        return self.plan.build(lambda i: PagedLayerCache(self.pool, i, meta), states.__getitem__)

    def _forward(self, tokens: mx.array, meta: PagedAttentionMetadata, states=()) -> mx.array:
        with forward_on(self.pool):
            return self.model(tokens, cache=self._caches(meta, states))

    def decode(self, rows: list[Request], prefill=()) -> list[RowOutput]:
        """One decode forward over `rows`; with `prefill` chunks `(request, tokens)`, the same
        forward also runs them (`_mixed`), so a chunk costs no forward of its own."""
        self._fill_state_slots()
        self._join(rows[len(self.decode_rows) :])
        forward = (lambda inputs: self._mixed(inputs, prefill)) if prefill else self._decode
        outputs = self.lookahead_step(rows, forward, pending_writes=self._written)
        for r, _ in prefill:
            self.kv.cache_blocks(r, r.num_computed_tokens)
        return outputs

    def _decode(self, inputs: mx.array) -> mx.array:
        """Logits of one decode step feeding `inputs`, one token per row of `decode_rows`."""
        real, tables, lens, slots = self._decode_batch(self.compiled_decode is not None)
        meta = self._decode_metadata(
            tables, lens, slots, rope_in_attention=self.pool.rope_inv_freq is not None
        )
        if self.compiled_decode is None:
            return self._decode_logits(inputs, meta)
        return self.compiled_decode(_padded(inputs, len(lens)), meta)[:real]

    def _decode_metadata(
        self, tables, lens: np.ndarray, slots, rope_in_attention: bool = False
    ) -> PagedAttentionMetadata:
        """Attention metadata of decode rows: one query each, at position `lens - 1`."""
        return PagedAttentionMetadata(
            block_tables=input_array(tables),
            context_lens=input_array(lens),
            offsets=input_array(lens - 1),
            slot_mapping=split_slots(slots, self.pool.block_size),
            num_query_tokens=1,
            rope_in_attention=rope_in_attention,
        )

    def _mixed(self, inputs: mx.array, prefill: list[tuple[Request, int]]) -> mx.array:
        """Logits of the decode rows from one eager forward that also runs `prefill`'s chunks:
        each chunk token is a row of one token after the decode rows (its own position, its
        own slot), and attention splits them again (`PagedAttentionMetadata.decode_rows`)."""
        # Padded as compiled steps are, so the decode kernels meet few shapes.
        real, tables, lens, slots = self._decode_batch(padded=True)
        ids, positions, chunk_slots, rows = [], [], [], []
        for r, n in prefill:
            start, table = r.num_computed_tokens - n, self.kv.get_block_ids(r)
            ids += r.all_token_ids[start : start + n]
            positions += range(start, start + n)
            chunk_slots += self._slots(table, start, n)
            rows.append(self._prefill_row(table, start, n))
        # The decode rows' own metadata is built once here, not sliced in every layer.
        decode = self._decode_metadata(tables, lens, slots)
        meta = dataclasses.replace(
            decode,
            offsets=input_array(np.concatenate([lens - 1, np.asarray(positions, np.int32)])),
            slot_mapping=split_slots(np.concatenate([slots, chunk_slots]), self.pool.block_size),
            prefill_rows=tuple(rows),
            decode_rows=decode,
        )
        tokens = mx.concatenate([_padded(inputs, len(lens)), mx.array(ids, inputs.dtype)])
        with forward_on(self.pool):
            hidden = self.logits_head.body(tokens[:, None], cache=self._caches(meta))
        return self.logits_head.head(hidden[:real, -1, :])

    def _decode_logits(self, inputs: mx.array, meta: PagedAttentionMetadata) -> mx.array:
        if self.states is None:
            return self._forward(inputs[:, None], meta)[:, -1, :]
        states = self.states.decode.caches(len(inputs))
        logits = self._forward(inputs[:, None], meta, states=states)[:, -1, :]
        self.states.decode.update(states)
        return logits

    def drop_decode_rows(self, requests: list[Request]) -> list[int] | None:
        keep = super().drop_decode_rows(requests)
        if keep is not None:
            self.block_table.keep_rows(keep)
            if self.states is not None:
                self.states.keep(keep)
        return keep

    def run_prompts(self, plan: PromptSchedule) -> None:
        self.prompt_rows.extend(plan.joining)
        if plan.starting:
            raise RuntimeError("the paged path starts rows in the decode forward (start_in_decode)")
        if plan.prefill:
            self._prefill(plan.prefill)

    def _join(self, rows: list[Request]) -> None:
        """Rows down to their last prompt token join the decode batch (`join_rows`); this
        step's decode forward feeds that token, so starting costs no forward of its own."""
        if not rows:
            return
        moved = {id(r) for r in rows}
        self.prompt_rows = [r for r in self.prompt_rows if id(r) not in moved]
        self.join_rows(rows)
        if self.states is not None:
            self.states.join(rows)
        for r in rows:
            self.block_table.add_row(self.kv.get_blocks(r))
            self.kv.cache_blocks(r, r.num_computed_tokens)

    def _prefill(self, prefill: list[tuple[Request, int]]) -> None:
        self._fill_state_slots()
        if self.states is None:
            counts = [n for _, n in prefill]
            align = self.pool.prefill_align
            starts = [r.num_computed_tokens - n for r, n in prefill]
            self._prefill_forward([r for r, _ in prefill], starts, counts,
                                  cdiv(max(counts), align) * align)  # fmt: skip
        else:
            self._prefill_states(prefill)
        states = self.states.row_states([r for r, _ in prefill]) if self.states is not None else []
        mx.eval(self.pool.pages, states)
        for r, _ in prefill:
            self.kv.cache_blocks(r, r.num_computed_tokens)

    def _prefill_forward(self, rows: list[Request], starts, counts, width: int, states=()):
        tokens = [r.all_token_ids[s : s + n] + [0] * (width - n)
                  for r, s, n in zip(rows, starts, counts)]  # fmt: skip
        self._forward(mx.array(tokens), self._metadata(rows, starts, counts, width), states=states)

    def _prefill_states(self, prefill: list[tuple[Request, int]]) -> None:
        """A hybrid's chunks, unpadded (recurrent layers would run padding into the state):
        rows of equal length share a forward (`prefill_segments`, which also says where a
        state snapshot is kept)."""
        for group in prefill_segments(prefill, self.pool.block_size):
            rows, n = [g.request for g in group], group[0].end - group[0].start
            states = self.states.rows_caches(rows)
            self._prefill_forward(rows, [g.start for g in group], [n] * len(rows), n, states)
            self.states.store_rows(rows, states)
            for g in group:
                if g.snapshot:
                    self.states.snapshot(g.request, g.end)

    def remove(self, requests: list[Request]) -> None:
        self.drop_decode_rows(requests)
        gone = {id(r) for r in requests}
        self.prompt_rows = [r for r in self.prompt_rows if id(r) not in gone]


def _padded(inputs: mx.array, num_rows: int) -> mx.array:
    """`inputs` with zero tokens appended up to `num_rows` (padding rows of a bucketed step)."""
    if num_rows == len(inputs):
        return inputs
    return mx.concatenate([inputs, mx.zeros(num_rows - len(inputs), inputs.dtype)])
