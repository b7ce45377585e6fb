"""The paged KV path: every row's K/V lives in blocks of one shared pool, addressed through its
block table, so joining and leaving a batch copy nothing and rows carry no padding in the cache.

Decode is pipelined as in the contiguous runner: a decode forward feeds the tokens sampled by
the previous one and returns them, while its own samples are computed asynchronously.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np

from mlx_paged.kv.attention_hook import forward_on
from mlx_paged.kv.cache_plan import AttentionSlot, CachePlan
from mlx_paged.kv.chunk_batch import batches_chunks
from mlx_paged.kv.kv_cache_manager import KVCacheManager, cdiv
from mlx_paged.kv.paged_cache import PagedAttentionMetadata, PagedKVPool, PagedLayerCache
from mlx_paged.kv.shape_buckets import bucket
from mlx_paged.kv.state_pool import StatePool
from mlx_paged.request import PromptSchedule, Request
from mlx_paged.runner.block_table import BlockTable
from mlx_paged.runner.chunk_rows import (
    CHUNK_ROW_READS,
    chunk_row_reads,
    mixed_step_rows,
    with_chunk_rows,
)
from mlx_paged.runner.compiled_decode import CompiledDecode
from mlx_paged.runner.group_metadata import decode_metadata, mixed_metadata, prefill_metadata
from mlx_paged.runner.hybrid_states import HybridStates, prefill_segments
from mlx_paged.runner.logits_head import split_logits_head
from mlx_paged.runner.model_runner import LookaheadDecoder, ModelRunner, RowOutput
from mlx_paged.runner.speculative_step import SpeculativeDecoder

logger = logging.getLogger(__name__)

# Narrowest table a compiled step is traced for, in blocks: short contexts share one trace.
MIN_COMPILED_TABLE_BLOCKS = 8


class PagedRunner(SpeculativeDecoder, LookaheadDecoder, ModelRunner):
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
        lean=None,
    ):
        self.model = model
        # The lean decode step (`models/lean_decode.py`), or None for mlx-lm's forward.
        self.lean = lean
        self.pool = pool
        self.kv = kv
        self.plan = plan or CachePlan([AttentionSlot(i) for i in range(pool.num_layers)])
        # Recurrent state of a hybrid model, else None.
        self.states = HybridStates(states, kv) if states is not None else None
        # The decode rows' block tables, one per KV cache group.
        self.block_tables = [BlockTable(pool.block_size, s) for s in pool.groups.scales]
        self.compiled_decode = (
            CompiledDecode(self._decode_logits, pool, self.states) if compile_decode else None
        )
        # The engine hands a step's prefill chunks to `decode`, to run in its forward; that
        # needs the logits head apart, so only the decode rows reach it.
        self.logits_head = split_logits_head(model)
        if self.lean is not None and self.logits_head is None:
            logger.info("decode steps run mlx-lm's forward: the logits head did not split")
            self.lean = None
        # A chunk's tokens run as rows of one token there, which recurrent state cannot take.
        self.mixes_prefill = self.logits_head is not None and states is None
        # Whether a mixed step's chunks attend in one call (`kv/chunk_batch.py`).
        self.batches_chunks = batches_chunks(pool)
        if self.logits_head is None:
            logger.info("prefill chunks run in forwards of their own: the model's logits head "
                        "could not be split from its body")  # fmt: skip
        self.reset()

    def reset(self) -> None:
        self.prompt_rows: list[Request] = []
        self.reset_decode()
        for table in self.block_tables:
            table.clear()
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

    def _decode_batch(self, padded: bool, rows: np.ndarray | None = None, context_lens=None,
                      min_rows: int = 0):  # fmt: skip
        """The query rows' count, lengths, and per KV cache group their tables and slots for
        this step, with the rows and tables padded to the compiled steps' buckets (and the rows
        to at least `min_rows`) when `padded`. One query per decode row, unless `rows` says
        whose table each query reads and `context_lens` how far (a speculative step's)."""
        if context_lens is None:
            # The scheduler already counted the fed token: it sits at num_computed_tokens - 1.
            context_lens = np.fromiter(
                (r.num_computed_tokens for r in self.decode_rows), np.int32, len(self.decode_rows)
            )
        num_rows, width = len(context_lens), max(t.sync() for t in self.block_tables)
        if padded:
            num_rows = max(bucket(num_rows), min_rows)
            width = bucket(width, MIN_COMPILED_TABLE_BLOCKS)
        tables, slots = [], []
        for table in self.block_tables:
            group_tables, lens, group_slots = table.decode_inputs(
                context_lens, num_rows, width, rows
            )
            tables.append(group_tables)
            slots.append(group_slots)
        return len(context_lens), tables, lens, slots

    def _caches(self, metas: list[PagedAttentionMetadata], states=()) -> list:
        """The model's caches for one forward: paged ones, each with its group's metadata of
        `metas`, and, on a hybrid, the `ArraysCache`s `states` (which the forward advances)."""
        group = self.pool.groups.layer_group
        return self.plan.build(
            lambda i: PagedLayerCache(self.pool, i, metas[group[i]]), states.__getitem__
        )

    def _forward(self, tokens: mx.array, metas: list, states=()) -> mx.array:
        with forward_on(self.pool):
            caches = self._caches(metas, states)
            # One token a row and no chunk rows riding along: the lean step where there is one.
            if self.lean is not None and tokens.shape[1] == 1 and metas[0].decode_rows is None:
                return self.logits_head.head(self.lean(tokens[:, 0], caches))[:, None]
            return self.model(tokens, cache=caches)

    def decode(self, rows: list[Request], prefill=()) -> list[RowOutput]:
        """One decode forward over `rows`; with `prefill` chunks `(request, tokens)`, the same
        forward also runs them (`_mixed`), so a chunk costs no forward of its own."""
        self._fill_state_slots()
        self._join(rows[len(self.decode_rows) :])
        if self.wants_speculation(rows, allowed=not prefill):
            outputs = self.speculative_step(rows)
        else:
            forward = (lambda inputs: self._mixed(inputs, prefill)) if prefill else self._decode
            outputs = self.lookahead_step(rows, forward, pending_writes=self._written)
        if self.spec_policy is not None:
            self.spec_policy.emitted(len(outputs))
        for r, _ in prefill:
            self.kv.cache_blocks(r, r.num_computed_tokens)
        return outputs

    def _decode(self, inputs: mx.array) -> mx.array:
        """Logits of one decode step feeding `inputs`, one token per row of `decode_rows`."""
        return self._verify_logits(inputs)

    def _verify_logits(self, inputs: mx.array, rows=None, context_lens=None) -> mx.array:
        """Logits of a decode forward feeding `inputs`, one query each: by default one per
        decode row; else query i reads row `rows[i]`'s pages up to `context_lens[i]` (a
        speculative step's tokens)."""
        padded = self.compiled_decode is not None
        real, tables, lens, slots = self._decode_batch(padded, rows, context_lens)
        metas = decode_metadata(tables, lens, slots, self.pool.rope_inv_freq is not None)
        if self.compiled_decode is None:
            return self._decode_logits(inputs, metas)
        return self.compiled_decode(_padded(inputs, len(lens)), metas)[:real]

    def _mixed(self, inputs: mx.array, prefill: list[tuple[Request, int]]) -> mx.array:
        """Logits of the decode rows from one eager forward that also runs `prefill`'s chunks:
        each chunk token is a row of one token after the decode rows (its own position, its
        own slot): plain decode rows where the pool has decode kernels and the chunks' reads
        allow (`runner/chunk_rows.py`), else split again by attention (`decode_rows`). Rows are
        padded as compiled steps' are, and where the pool buckets mixed steps, to few sizes."""
        chunk_tokens = sum(n for _, n in prefill)
        rows = mixed_step_rows(len(self.decode_rows), chunk_tokens, self.pool.bucket_mixed_steps)
        as_rows = self.pool.chunks_as_rows and chunk_row_reads(prefill) <= CHUNK_ROW_READS
        # As rows, padding rows follow the chunk tokens; else the decode rows take the padding.
        padding = 0 if as_rows else rows - chunk_tokens
        real, tables, lens, slots = self._decode_batch(padded=True, min_rows=padding)
        num_decode = len(lens)
        if as_rows:
            tables, lens, slots, ids = with_chunk_rows(self.kv, prefill, tables, lens, slots, rows)
            metas = decode_metadata(tables, lens, slots)
        else:  # the decode rows' own metadata is built once here, not sliced in every layer
            decode = decode_metadata(tables, lens, slots)
            metas, ids = mixed_metadata(self.kv, decode, lens, slots, prefill,
                                        self.batches_chunks)  # fmt: skip
        tokens = mx.concatenate([_padded(inputs, num_decode), mx.array(ids, inputs.dtype)])
        if as_rows:  # the padding rows after the chunk tokens
            tokens = _padded(tokens, len(lens))
        with forward_on(self.pool):
            caches = self._caches(metas)
            if self.lean is not None:  # every row one token: the lean step takes them too
                return self.logits_head.head(self.lean(tokens, caches)[:real])
            hidden = self.logits_head.body(tokens[:, None], cache=caches)
        return self.logits_head.head(hidden[:real, -1, :])

    def _decode_logits(self, inputs: mx.array, metas: list) -> mx.array:
        if self.states is None:
            return self._forward(inputs[:, None], metas)[:, -1, :]
        states = self.states.decode.caches(len(inputs))
        logits = self._forward(inputs[:, None], metas, states=states)[:, -1, :]
        self.states.decode.update(states)
        return logits

    def drop_decode_rows(self, requests: list[Request]) -> list[int] | None:
        keep = super().drop_decode_rows(requests)
        if keep is not None:
            for table in self.block_tables:
                table.keep_rows(keep)
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
            for g, table in enumerate(self.block_tables):
                table.add_row(self.kv.get_blocks(r, g))
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
        tokens = [r.token_id_range(s, s + n) + [0] * (width - n)
                  for r, s, n in zip(rows, starts, counts)]  # fmt: skip
        metas = prefill_metadata(self.kv, rows, starts, counts, width)
        self._forward(mx.array(tokens), metas, states=states)

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
        if self.proposer is not None:
            for r in requests:
                self.proposer.forget(r.request_id)
        gone = {id(r) for r in requests}
        self.prompt_rows = [r for r in self.prompt_rows if id(r) not in gone]


def _padded(inputs: mx.array, num_rows: int) -> mx.array:
    """`inputs` with zero tokens appended up to `num_rows` (padding rows of a bucketed step)."""
    if num_rows == len(inputs):
        return inputs
    return mx.concatenate([inputs, mx.zeros(num_rows - len(inputs), inputs.dtype)])
