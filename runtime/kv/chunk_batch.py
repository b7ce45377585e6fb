"""The prefill chunks that ride in one decode forward, laid out for a single attention call.

Each chunk attended on its own costs a gather and an SDPA (and their reshapes) in every layer,
so a step with eight chunks built eight times the attention ops of a step with one. Where the
attention shapes need no buckets (Metal, the CPU), the chunks go together instead: each a row
of queries padded at its end to the longest chunk, over its own block table, under one mask.
The index arrays are built once a step on the host and shared by every layer of the group.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MIN_CHUNKS = 2  # one chunk keeps its own call: nothing to batch


def batches_chunks(pool) -> bool:
    """Whether `pool`'s mixed steps attend their chunks in one call: not on CUDA, whose SDPA
    builds a graph for every shape it meets (its chunks keep the buckets of
    `kv/prefill_shapes.py`), nor over quantized pages (chunks from position 0 attend over
    their fresh K/V there, not over pages rounded to 8 or 4 bits)."""
    on_cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    return not on_cuda and not pool.quantized


@dataclass(frozen=True)
class ChunkBatch:
    """R chunks as rows of N queries: `tables (R, max_blocks)`, `context_lens (R,)` and
    `positions (R, N)` for `paged_attention_reference`; `query_rows (R * N,)` picks each padded
    query from the forward's chunk tokens, `token_rows (C,)` each chunk token's output back."""

    tables: mx.array
    context_lens: mx.array
    positions: mx.array
    query_rows: mx.array
    token_rows: mx.array

    @property
    def shape(self) -> tuple[int, int]:
        """(R chunks, N queries a row)."""
        return self.positions.shape


def chunk_batch(rows: list[tuple[int, int, list[int]]]) -> ChunkBatch | None:
    """The batch of chunks `(start, count, the row's page ids)` in order (tables longer than a
    chunk reaches are fine: the mask stops at its context); None below `MIN_CHUNKS` chunks."""
    if len(rows) < MIN_CHUNKS:
        return None
    width = max(count for _, count, _ in rows)
    max_blocks = max(len(table) for *_, table in rows)
    tables = np.zeros((len(rows), max_blocks), np.int32)
    query_rows = np.empty((len(rows), width), np.int32)
    token_rows, at = [], 0
    for r, (_, count, table) in enumerate(rows):
        tables[r, : len(table)] = table
        # Padding queries repeat the chunk's last token: finite, and never read back.
        query_rows[r] = at + np.minimum(np.arange(width), count - 1)
        token_rows.append(r * width + np.arange(count))
        at += count
    starts = np.array([start for start, _, _ in rows], np.int32)
    counts = np.array([count for _, count, _ in rows], np.int32)
    return ChunkBatch(
        tables=mx.array(tables),
        context_lens=mx.array(starts + counts),
        positions=mx.array(starts[:, None] + np.arange(width, dtype=np.int32)[None]),
        query_rows=mx.array(query_rows.reshape(-1)),
        token_rows=mx.array(np.concatenate(token_rows).astype(np.int32)),
    )
