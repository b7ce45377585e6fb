"""Multi-head latent attention (MLA) on latent pages.

An MLA layer caches, per token, its compressed latent and its RoPE key part, shared by every
query head: on pages, the latent is the layer's K side (`(1, R)` a token) and the RoPE part its
V side (`(1, P)`), exactly what mlx-lm's MLA code keeps in its `KVCache`. Attention follows
mlx-lm's two forms. Decode (one query a row) runs absorbed: queries projected into the latent
space (`embed_q`) attend over the latent rows, and the output is projected back per head
(`unembed_out`). Prefill expands the latent rows into per-head keys and values first. The
RoPE part of the scores is an additive bias in both (mlx-lm's `pe_scores`).
"""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.kernels.latent_attention import latent_attention_decode
from mlx_paged.kernels.latent_attention_reference import latent_attention_reference, rope_scores
from mlx_paged.kernels.paged_attention_reference import gather_kv, paged_attention_mask
from mlx_paged.kv.paged_cache import PagedLayerCache


def latent_attention(q_nope, q_rope, latent, rope, cache, attn, sparse=None) -> mx.array:
    """Write this forward's latent rows into `cache` and attend.

    Args:
        q_nope, q_rope: `(B, H, L, nope)` queries and their RoPE'd part `(B, H, L, P)`.
        latent, rope: this forward's `(B, 1, L, R)` latent rows and `(B, 1, L, P)` RoPE keys.
        cache: a `PagedLayerCache`, or the layout probe's recording cache.
        attn: the MLA module: its `embed_q`, `unembed_out` and `scale`.
        sparse: DeepSeek Sparse Attention's selection (`SparseSelection`), or None.

    Returns:
        `(B, H, L, V)` per-head outputs, before the output projection.
    """
    latent, rope = cache.update_and_fetch(latent, rope)
    if not isinstance(cache, PagedLayerCache):  # the load's probe sees a forward from 0
        cache.observe_attention(q_nope, latent, rope, None, latent=True)
        return _expanded(q_nope, q_rope, latent, rope, _own_mask(q_nope, sparse), attn)
    meta = cache.metadata
    if meta.rope_in_attention:
        raise ValueError("latent attention cannot fuse RoPE into attention: use --fused-rope off")
    if meta.decode_rows is not None:
        return _mixed(q_nope, q_rope, cache, attn, sparse)
    if meta.num_query_tokens == 1:
        return _decode(q_nope, q_rope, cache, meta, attn, sparse)
    if meta.starts_at_zero:
        cache.pool.attention_calls["latent_causal", "prefill"] += 1
        return _expanded(q_nope, q_rope, latent, rope, _own_mask(q_nope, sparse), attn)
    return _prefill_rows(q_nope, q_rope, cache, attn, sparse)


def _own_mask(q_nope, sparse) -> mx.array:
    """`(1 or B, 1, L, L)`: rows that start at position 0, padded at their end, see their own
    earlier tokens only, so their padding stays out of their real queries' view; with `sparse`,
    only the tokens it keeps."""
    batch, _, length, _ = q_nope.shape
    causal = mx.tril(mx.ones((length, length), dtype=mx.bool_))[None, None]
    if sparse is None:
        return causal
    visible = mx.broadcast_to(causal, (batch, 1, length, length))
    return sparse.keep(sparse.queries, sparse.weights, sparse.new_keys, visible)


def _expanded(q_nope, q_rope, latent, rope, mask, attn) -> mx.array:
    """mlx-lm's prefill form: per-head keys and values expanded from the latent rows
    `(b, 1, T, R)`, the RoPE scores added as a bias under the boolean `mask` `(b, 1, L, T)`."""
    keys = attn.embed_q(latent, transpose=False)
    values = attn.unembed_out(latent)
    bias = rope_scores(q_rope, rope, mask, attn.scale)
    return mx.fast.scaled_dot_product_attention(q_nope, keys, values, scale=attn.scale, mask=bias)


def _decode(q_nope, q_rope, cache, meta, attn, sparse=None, rows=slice(None)) -> mx.array:
    """One query a row, absorbed: the latent queries over the latent pages, on the kernels
    where the pool has a decode backend and no sparse selection narrows the keys (`rows`:
    the selection's rows these are)."""
    pool, q_latent = cache.pool, attn.embed_q(q_nope)
    pages = (cache.k_pages, cache.v_pages, meta.block_tables, meta.context_lens)
    keep = None
    if sparse is not None:
        pool.attention_calls["latent_sparse", "decode"] += 1
        keys = sparse.keys(meta.block_tables)
        visible = paged_attention_mask(meta.query_positions, meta.context_lens, keys.shape[2])
        keep = sparse.keep(sparse.queries[rows], sparse.weights[rows], keys, visible)
    elif pool.decode_backend is not None:
        pool.attention_calls["latent_kernel", "decode"] += 1
        out = latent_attention_decode(q_latent, q_rope, *pages, scale=attn.scale,
                                      backend=pool.decode_backend)  # fmt: skip
        return attn.unembed_out(out)
    else:
        pool.attention_calls["latent_reference", "decode"] += 1
    out = latent_attention_reference(q_latent, q_rope, *pages, meta.query_positions,
                                     scale=attn.scale, mask=keep)  # fmt: skip
    return attn.unembed_out(out)


def _row_context(cache, start: int, count: int, table: mx.array, sparse=None, queries=None):
    """A chunk's context, `(1, 1, T, R)` latent and `(1, 1, T, P)` RoPE rows of its blocks,
    and the `(1, 1, count, T)` mask of its queries at positions `start...`; with `sparse`, of
    the keys it keeps for the chunk's indexer `queries` (its queries and weights)."""
    latent, rope = gather_kv(cache.k_pages, cache.v_pages, table[None])
    positions = (start + mx.arange(count))[None]
    lens = mx.array([start + count], mx.int32)
    mask = paged_attention_mask(positions, lens, latent.shape[2])
    if sparse is not None:
        mask = sparse.keep(*queries, sparse.keys(table[None]), mask)
    return latent, rope, mask


def _prefill_rows(q_nope, q_rope, cache, attn, sparse=None) -> mx.array:
    """Each prefill row's queries over its gathered context; padding rows come out as zeros."""
    width = q_nope.shape[2]
    outs = []
    for row, (start, count, table) in enumerate(cache.metadata.prefill_rows):
        cache.pool.attention_calls["latent_rows", "prefill"] += 1
        index = None
        if sparse is not None:
            index = [x[row : row + 1, :, :count] for x in (sparse.queries, sparse.weights)]
        latent, rope, mask = _row_context(cache, start, count, table, sparse, index)
        q = (q_nope[row : row + 1, :, :count], q_rope[row : row + 1, :, :count])
        out = _expanded(*q, latent, rope, mask, attn)
        if count < width:
            out = mx.pad(out, ((0, 0), (0, 0), (0, width - count), (0, 0)))
        outs.append(out)
    return mx.concatenate(outs) if len(outs) > 1 else outs[0]


def _mixed(q_nope, q_rope, cache, attn, sparse=None) -> mx.array:
    """A decode forward that runs prefill chunks: the decode rows attend as a decode step does,
    then each chunk's tokens (rows of one token, in order) over the chunk's context."""
    decode = cache.metadata.decode_rows
    rows = decode.context_lens.shape[0]
    outs = [_decode(q_nope[:rows], q_rope[:rows], cache, decode, attn, sparse, slice(0, rows))]
    at = rows
    for start, count, table in cache.metadata.prefill_rows:
        cache.pool.attention_calls["latent_rows", "prefill"] += 1
        index = None
        if sparse is not None:
            index = [x[at : at + count].transpose(2, 1, 0, 3) for x in
                     (sparse.queries, sparse.weights)]  # fmt: skip
        latent, rope, mask = _row_context(cache, start, count, table, sparse, index)
        chunk = [q[at : at + count].transpose(2, 1, 0, 3) for q in (q_nope, q_rope)]
        outs.append(_expanded(*chunk, latent, rope, mask, attn).transpose(2, 1, 0, 3))
        at += count
    return mx.concatenate(outs)
