"""A forward's attention metadata for each KV cache group (`kv/kv_groups.py`): the rows, their
lengths and positions are the same in every group; block tables and write slots are each
group's own. Tables list pages of `block_size` tokens: a group whose blocks hold several pages
(`KVCacheGroups.page_scale`) lists each block's."""

from __future__ import annotations

import dataclasses

import numpy as np

from mlx_paged.kernels.kernel_inputs import input_array
from mlx_paged.kv.chunk_batch import chunk_batch
from mlx_paged.kv.kv_cache_manager import cdiv
from mlx_paged.kv.page_arrays import make_slot_mapping
from mlx_paged.kv.paged_cache import PagedAttentionMetadata
from mlx_paged.runner.block_table import page_ids


def slots_of(table: list[int], start: int, count: int, block_size: int) -> np.ndarray:
    """Pool slots of positions `start...start + count` of a row with block ids `table`."""
    positions = np.arange(start, start + count)
    first = start // block_size
    blocks = np.asarray(table[first : (start + count - 1) // block_size + 1], np.int64)
    return blocks[positions // block_size - first] * block_size + positions % block_size


def prefill_row(table: list[int], start: int, count: int, block_size: int):
    """A `prefill_rows` entry: the chunk and its table trimmed to the blocks it reaches."""
    return start, count, input_array(table[: cdiv(start + count, block_size)])


def group_pages(kv, request, group: int) -> list[int]:
    """The pages of `request`'s blocks in `group`."""
    return page_ids(kv.get_block_ids(request, group), kv.group_scales[group])


def prefill_metadata(kv, rows, starts, counts, width: int) -> list[PagedAttentionMetadata]:
    """Per group, the metadata of rows writing `counts[b]` tokens from `starts[b]`, padded to
    `width` (padding writes land in the null block)."""
    bs = kv.block_size
    metas = []
    for g in range(len(kv.group_windows)):
        tables = [group_pages(kv, r, g) for r in rows]
        max_blocks = max(len(t) for t in tables)
        slots = np.zeros((len(rows), width), np.int32)  # padding writes the null block
        for row, (table, start, n) in enumerate(zip(tables, starts, counts)):
            slots[row, :n] = slots_of(table, start, n, bs)
        metas.append(PagedAttentionMetadata(
            block_tables=input_array([t + [0] * (max_blocks - len(t)) for t in tables]),
            context_lens=input_array([s + n for s, n in zip(starts, counts)]),
            offsets=input_array(starts),
            slot_mapping=make_slot_mapping(slots),
            num_query_tokens=width,
            # Prefill only: a start forward (one token per row) attends like a decode step.
            prefill_rows=tuple(prefill_row(*row, bs) for row in zip(tables, starts, counts))
            if width > 1
            else (),
        ))  # fmt: skip
    return metas


def decode_metadata(
    tables: list, lens: np.ndarray, slots: list, rope_in_attention: bool = False
) -> list[PagedAttentionMetadata]:
    """Per group, the metadata of decode rows (one query each, at `lens - 1`) from that group's
    `tables[g]` and `slots[g]`."""
    return [
        PagedAttentionMetadata(
            block_tables=input_array(t),
            context_lens=input_array(lens),
            offsets=input_array(lens - 1),
            slot_mapping=make_slot_mapping(s),
            num_query_tokens=1,
            rope_in_attention=rope_in_attention,
        )
        for t, s in zip(tables, slots)
    ]


def mixed_metadata(kv, decode: list[PagedAttentionMetadata], lens, slots, prefill,
                   batch_chunks: bool = False):  # fmt: skip
    """Per group, the metadata of a decode forward that also runs `prefill` chunks `(request,
    tokens)`: each chunk token a row of one token after the decode rows, at its own position
    and slot; `decode_rows` keeps the decode rows' own metadata. Also the chunk tokens' ids.
    `batch_chunks`: lay the chunks out for one attention call (`chunk_batch`)."""
    ids, positions = [], [lens - 1]
    for r, n in prefill:
        start = r.num_computed_tokens - n
        ids += r.token_id_range(start, start + n)
        positions.append(np.arange(start, start + n, dtype=np.int32))
    offsets = input_array(np.concatenate(positions))
    metas = []
    for g, (meta, group_slots) in enumerate(zip(decode, slots)):
        row_slots, rows, chunks = [group_slots], [], []
        for r, n in prefill:
            start, table = r.num_computed_tokens - n, group_pages(kv, r, g)
            row_slots.append(slots_of(table, start, n, kv.block_size))
            rows.append(prefill_row(table, start, n, kv.block_size))
            chunks.append((start, n, table))
        metas.append(dataclasses.replace(
            meta,
            offsets=offsets,
            slot_mapping=make_slot_mapping(np.concatenate(row_slots)),
            prefill_rows=tuple(rows),
            decode_rows=meta,
            chunk_batch=chunk_batch(chunks) if batch_chunks else None,
        ))  # fmt: skip
    return metas, ids
