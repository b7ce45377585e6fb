"""Pure-MLX paged attention: gather each row's pages into contiguous K/V, then
`mx.fast.scaled_dot_product_attention` with a position mask. Runs anywhere; it is the oracle
every paged kernel is tested against, and the CPU path."""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.kernels.quantized_pages import QuantizedPages


def gather_pages(pages: mx.array | QuantizedPages, block_tables: mx.array) -> mx.array:
    """`[num_blocks, block_size, H, D]` pages + `(B, max_blocks)` tables -> `(B, H, T, D)`,
    with `T = max_blocks * block_size`; positions past a row's length hold garbage. Quantized
    pages come out dequantized."""
    ids = block_tables.reshape(-1)
    if isinstance(pages, QuantizedPages):
        gathered = pages.gather(ids).dequantize()
    else:
        gathered = pages[ids]
    return _token_major(gathered, block_tables.shape)


def gather_kv(k_pages, v_pages, block_tables: mx.array) -> tuple[mx.array, mx.array]:
    """`gather_pages` of both sides; the rows of quantized pages, which hold both, are gathered
    once."""
    if not isinstance(k_pages, QuantizedPages):
        return gather_pages(k_pages, block_tables), gather_pages(v_pages, block_tables)
    kv = k_pages.kv.gather(block_tables.reshape(-1))
    return tuple(_token_major(side.dequantize(), block_tables.shape) for side in (kv.k, kv.v))


def _token_major(gathered: mx.array, table_shape: tuple[int, int]) -> mx.array:
    """Gathered blocks `(B * max_blocks, block_size, H, D)` -> `(B, H, T, D)`."""
    num_rows, max_blocks = table_shape
    _, block_size, heads, dim = gathered.shape
    return gathered.reshape(num_rows, max_blocks * block_size, heads, dim).transpose(0, 2, 1, 3)


def paged_attention_mask(
    query_positions: mx.array,
    context_lens: mx.array,
    num_keys: int,
    window: int | None = None,
    chunk: int | None = None,
) -> mx.array:
    """Boolean `(B, 1, L, T)` mask: key t is visible to the query at position p of row b when
    t <= p, t < context_lens[b], with a sliding window t > p - window, and with attention in
    chunks t // chunk == p // chunk.

    A query row that would see nothing (a padding position) sees key 0 instead, so no row of
    the softmax is empty (an empty row would give NaN).
    """
    keys = mx.arange(num_keys)[None, None, :]
    pos = query_positions[:, :, None]
    visible = (keys <= pos) & (keys < context_lens[:, None, None])
    if window is not None:
        visible = visible & (keys > pos - window)
    if chunk is not None:
        visible = visible & (keys // chunk == pos // chunk)
    empty = ~mx.any(visible, axis=-1, keepdims=True)
    visible = visible | (empty & (keys == 0))
    return visible[:, None, :, :]


def paged_attention_reference(
    queries: mx.array,
    k_pages: mx.array,
    v_pages: mx.array,
    block_tables: mx.array,
    context_lens: mx.array,
    query_positions: mx.array,
    *,
    scale: float,
    window: int | None = None,
    sinks: mx.array | None = None,
    softcap: float | None = None,
    chunk: int | None = None,
) -> mx.array:
    """Attention of `(B, Hq, L, D)` queries over paged K/V.

    Args:
        queries: RoPE'd queries, `(B, Hq, L, D)`.
        k_pages, v_pages: `[num_blocks, block_size, Hkv, D]` (GQA: Hq a multiple of Hkv).
        block_tables: `(B, max_blocks)` int32; unused entries point at the null block 0.
        context_lens: `(B,)` tokens of each row in the cache, this step's included.
        query_positions: `(B, L)` position of each query token.
        scale: softmax scale.
        window: sliding-window size, or None for full attention.
        sinks: attention sinks, passed through to SDPA.
        softcap: scores become `softcap * tanh(scores / softcap)` before the mask (gemma2).
        chunk: attention within chunks of this many positions (llama4), or None.
    """
    keys, values = gather_kv(k_pages, v_pages, block_tables)
    mask = paged_attention_mask(query_positions, context_lens, keys.shape[2], window, chunk)
    if softcap is not None:
        if sinks is not None:
            raise ValueError("attention sinks with soft-capped scores are not implemented")
        return softcapped_attention(queries, keys, values, scale, mask, softcap)
    return mx.fast.scaled_dot_product_attention(
        queries, keys, values, scale=scale, mask=mask, sinks=sinks
    )


def softcapped_attention(queries, keys, values, scale: float, mask: mx.array, softcap: float):
    """Attention with soft-capped scores, op for op as mlx-lm's gemma2 computes it: queries
    `(B, Hq, L, D)` over keys and values `(B, Hkv, T, D)`, boolean `mask` `(B, 1, L, T)`."""
    b, num_heads, length, dim = queries.shape
    repeats = num_heads // keys.shape[1]
    queries = queries * scale
    if repeats > 1:
        queries = queries.reshape(b, keys.shape[1], repeats, length, dim)
        keys, values, mask = keys[:, :, None], values[:, :, None], mask[:, :, None]
    scores = queries @ keys.swapaxes(-1, -2)
    scores = mx.tanh(scores / softcap) * softcap
    scores = mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))
    out = mx.softmax(scores, precise=True, axis=-1) @ values
    return out.reshape(b, num_heads, length, -1)


def rotate_half_rope(x: mx.array, positions: mx.array, rope_inv_freq: mx.array) -> mx.array:
    """Non-interleaved RoPE of `(B, H, L, D)` rows at `positions` `(B,)` (+ their token index):
    dims i and i + n (n = len(rope_inv_freq)) turn by `position * rope_inv_freq[i]`; the dims
    past 2n pass through."""
    dims = 2 * rope_inv_freq.shape[0]
    freqs = 1.0 / rope_inv_freq.astype(mx.float32)
    return mx.fast.rope(x, dims, traditional=False, base=None, scale=1.0, offset=positions,
                        freqs=freqs)  # fmt: skip


def paged_attention_decode_rope_reference(
    queries: mx.array,
    keys: mx.array,
    values: mx.array,
    k_pages: mx.array,
    v_pages: mx.array,
    block_tables: mx.array,
    context_lens: mx.array,
    *,
    scale: float,
    rope_inv_freq: mx.array,
    window: int | None = None,
) -> tuple[mx.array, mx.array]:
    """Oracle of `paged_attention_decode_rope`: rotate the step's query and key, attend over the
    gathered pages with the new token placed at position `context_lens - 1`, and return
    `(output, rotated keys)`."""
    positions = context_lens - 1
    queries = rotate_half_rope(queries, positions, rope_inv_freq)
    keys = rotate_half_rope(keys, positions, rope_inv_freq)
    gathered_k, gathered_v = gather_kv(k_pages, v_pages, block_tables)
    num_keys = gathered_k.shape[2]
    at_new = (mx.arange(num_keys)[None, :] == positions[:, None])[:, None, :, None]
    gathered_k = mx.where(at_new, keys, gathered_k)
    gathered_v = mx.where(at_new, values, gathered_v)
    mask = paged_attention_mask(positions[:, None], context_lens, num_keys, window)
    out = mx.fast.scaled_dot_product_attention(
        queries, gathered_k, gathered_v, scale=scale, mask=mask
    )
    return out, keys
