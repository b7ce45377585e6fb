"""Prefill attention row by row over paged K/V: a row's queries over its gathered context
(`causal_row`), and the prefill chunks that ride in a decode forward (`chunk_rows_attention`),
where every chunk token is a row of one token."""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.kernels.paged_attention_reference import gather_kv, paged_attention_reference


def row_shapes(pool):
    """The pool's bucketed prefill shapes where rows over a context use them (CUDA), else
    None."""
    shapes = pool.prefill_shapes
    return shapes if shapes is not None and shapes.rows_bucketed else None


def causal_row(queries: mx.array, cache, start: int, table: mx.array, scale) -> mx.array:
    """One row's queries `(1, H, count, D)` at positions `start...` over its gathered context,
    with MLX's causal SDPA (which aligns the queries to the end of the keys); in buckets with
    the pool's `prefill_shapes` (CUDA, `PrefillShapes.attend_row`)."""
    total = start + queries.shape[2]
    keys, values = (x[:, :, :total] for x in gather_kv(cache.k_pages, cache.v_pages, table[None]))
    if keys.shape[2] < total:  # the padding reaches past the row's last block
        room = ((0, 0), (0, 0), (0, total - keys.shape[2]), (0, 0))
        keys, values = mx.pad(keys, room), mx.pad(values, room)
    shapes = row_shapes(cache.pool)
    if shapes is not None:
        return shapes.attend_row(queries, keys, values, scale)
    return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask="causal")


def chunk_rows_attention(queries, keys, values, cache, scale, mask, sinks) -> mx.array:
    """Attention of the chunk tokens of a decode forward that runs prefill chunks: `queries`
    `(C, H, 1, D)` and the forward's new `keys`/`values` `(C, KV, 1, D)` under the layer's
    `PagedMask`, the chunks of `cache.metadata.prefill_rows` one after another. Where the
    metadata lays them out for it (`chunk_batch`), all in one call over their pages; else
    chunks that start at 0 attend together over their own K/V in one call, the others over
    their gathered context, one call each."""
    pool = cache.pool
    if cache.metadata.chunk_batch is not None:
        return _batched_rows(queries, cache, scale, mask, sinks)
    spans, at = [], 0
    for start, count, table in cache.metadata.prefill_rows:
        spans.append((at, start, count, table))
        at += count
    window = mask.window
    plain = sinks is None and mask.softcap is None and mask.chunk is None
    causal_fits = [plain and (window is None or window >= s + n) for _, s, n, _ in spans]
    own = [span for span, fits in zip(spans, causal_fits) if fits and span[1] == 0]
    outs = _own_rows(queries, keys, values, own, scale, pool) if own else {}
    for (at, start, count, table), fits in zip(spans, causal_fits):
        if at in outs:
            continue
        chunk = queries[at : at + count].transpose(2, 1, 0, 3)  # (1, H, count, D)
        if fits:
            pool.attention_calls["causal_rows", "prefill"] += 1
            out = causal_row(chunk, cache, start, table, scale)
        else:
            pool.attention_calls["reference", "prefill"] += 1
            positions = (start + mx.arange(count))[None]
            lens = mx.array([start + count], mx.int32)
            pages = (cache.k_pages, cache.v_pages)
            out = paged_attention_reference(chunk, *pages, table[None], lens, positions,
                                            scale=scale, window=window, sinks=sinks,
                                            softcap=mask.softcap, chunk=mask.chunk)  # fmt: skip
        outs[at] = out.transpose(2, 1, 0, 3)
    return mx.concatenate([outs[at] for at, *_ in spans])


def _batched_rows(queries, cache, scale, mask, sinks) -> mx.array:
    """Every chunk in one call (`kv/chunk_batch.py`): its queries a padded row over its pages,
    under the layer's mask; each real query's output picked back in chunk order."""
    batch = cache.metadata.chunk_batch
    (rows, width), (_, heads, _, dim) = batch.shape, queries.shape
    cache.pool.attention_calls["batched_rows", "prefill"] += 1
    q = queries[batch.query_rows].reshape(rows, width, heads, dim).transpose(0, 2, 1, 3)
    out = paged_attention_reference(
        q, cache.k_pages, cache.v_pages, batch.tables, batch.context_lens, batch.positions,
        scale=scale, window=mask.window, sinks=sinks, softcap=mask.softcap, chunk=mask.chunk,
    )  # fmt: skip
    out = out.transpose(0, 2, 1, 3).reshape(rows * width, heads, out.shape[-1])
    return out[batch.token_rows][:, :, None]


def _own_rows(queries, keys, values, spans, scale, pool) -> dict[int, mx.array]:
    """Chunks from position 0, batched: each padded at its end to the widest (causal masking
    hides the padding from the real queries) for one causal SDPA over their own K/V."""
    width = max(count for _, _, count, _ in spans)

    def batch(x):  # rows of one token (C, heads, 1, D) -> (R, heads, width, D)
        rows = [mx.pad(x[at : at + n], ((0, width - n), (0, 0), (0, 0), (0, 0)))
                for at, _, n, _ in spans]  # fmt: skip
        return mx.stack(rows)[:, :, :, 0].transpose(0, 2, 1, 3)

    q, k, v = batch(queries), batch(keys), batch(values)
    pool.attention_calls["causal", "prefill"] += 1
    if pool.prefill_shapes is not None:
        out = pool.prefill_shapes.attend_own(q, k, v, scale)
    else:
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")
    return {
        at: out[i, :, :n].transpose(1, 0, 2)[:, :, None] for i, (at, _, n, _) in enumerate(spans)
    }
