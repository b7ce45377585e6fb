"""Prefill chunks that ride in a decode forward as decode rows of their own.

A chunk attended as prefill costs its own gathers, pads and SDPA in every layer (a CPU count of
a mixed step's graph: 88 nodes a layer with one chunk, 135 with four, where a fused decode layer
has 9 on CUDA), and MLX pays its host time per node, so a step carrying 64 prompt tokens took
11 ms where a decode step took 3.4 ms (H100, random llama 1B). As rows, each chunk token is one
query over its request's pages up to its own position: the step is a plain decode step of more
rows, one decode kernel call a layer, whose K/V writes come before its reads. The price is that
every chunk token reads its whole context from the pages, so chunks go this way only while what
they read in all stays under `CHUNK_ROW_READS` context tokens a layer.
"""

from __future__ import annotations

import math

import numpy as np

from mlx_paged.kv.shape_buckets import bucket, fine_bucket
from mlx_paged.runner.group_metadata import group_pages, slots_of

# Most context tokens all chunk rows of a step read a layer (a 512-token chunk from position 0
# reads 131k): beyond it, the pages re-read cost more than the prefill path's host time saves.
CHUNK_ROW_READS = 1 << 18
MIXED_STEP_MIN_ROWS = 256  # a bucketed mixed step's fewest rows, decode and chunk tokens


def row_reads(start: int, n: int) -> int:
    """Context tokens a chunk of `n` tokens from position `start` reads a layer as rows: its
    token i reads start + i + 1."""
    return n * start + n * (n + 1) // 2


def tokens_within_reads(start: int, reads: int) -> int:
    """The most tokens a chunk from position `start` may take as rows within `reads`."""
    b = 2 * start + 1  # row_reads(start, n) = n * (n + b) / 2
    n = (math.isqrt(b * b + 8 * max(reads, 0)) - b) // 2
    return n + 1 if row_reads(start, n + 1) <= reads else n


def chunk_row_reads(prefill) -> int:
    """Context tokens the chunks `(request, tokens)` of a step read a layer as rows."""
    return sum(row_reads(request.num_computed_tokens - n, n) for request, n in prefill)


def mixed_step_rows(decode_rows: int, chunk_tokens: int, bucketed: bool) -> int:
    """A mixed step's rows, decode rows (padded to their bucket) and chunk tokens together,
    padded to few sizes where `bucketed`."""
    rows = bucket(decode_rows) + chunk_tokens
    return fine_bucket(rows, MIXED_STEP_MIN_ROWS) if bucketed else rows


def with_chunk_rows(kv, prefill, tables: list, lens: np.ndarray, slots: list, total: int):
    """The decode batch's per-group `tables`, `lens` and `slots` with a row for every token of
    the chunks `prefill` `(request, tokens)` after the decode rows, then padding rows (length 1,
    writing slot 0 of the null block) up to `total` rows; and the chunk tokens' ids."""
    starts = [r.num_computed_tokens - n for r, n in prefill]
    ids = [t for (r, n), s in zip(prefill, starts) for t in r.token_id_range(s, s + n)]
    chunk_lens = np.concatenate([np.arange(s + 1, s + n + 1) for (_, n), s in zip(prefill, starts)])
    rows = len(lens) + len(chunk_lens)
    pad = total - rows
    out_lens = np.concatenate([lens, chunk_lens, np.ones(pad, np.int32)]).astype(np.int32)
    out_tables, out_slots = [], []
    for g, (table, group_slots) in enumerate(zip(tables, slots)):
        pages = [group_pages(kv, r, g) for r, _ in prefill]
        needed = max(len(p) for p in pages)
        width = max(table.shape[1], bucket(needed))  # the decode tables' width is bucketed
        grown = np.zeros((total, width), np.int32)
        grown[: len(table), : table.shape[1]] = table
        at = len(table)
        row_slots = [group_slots]
        for p, (_, n), s in zip(pages, prefill, starts):
            grown[at : at + n, : len(p)] = p
            row_slots.append(slots_of(p, s, n, kv.block_size))
            at += n
        row_slots.append(np.zeros(pad, np.int64))
        out_tables.append(grown)
        out_slots.append(np.concatenate(row_slots).astype(np.int32))
    return out_tables, out_lens, out_slots, ids
