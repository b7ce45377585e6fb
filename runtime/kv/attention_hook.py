"""Route mlx-lm's attention to paged attention without forking model files.

Most mlx-lm model modules bind `scaled_dot_product_attention` from `models.base` at import, so
the hook replaces that name in every loaded `mlx_lm.models.*` module. Calls whose cache is a
`PagedLayerCache` go to paged attention; every other call goes to mlx-lm's own function.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import mlx.core as mx
import mlx_lm.models.base as base

from mlx_paged.kernels.paged_attention import (
    paged_attention_decode,
    paged_attention_decode_rope,
)
from mlx_paged.kernels.paged_attention_reference import (
    paged_attention_decode_rope_reference,
    paged_attention_reference,
)
from mlx_paged.kv.kv_cache_manager import cdiv
from mlx_paged.kv.paged_cache import PagedLayerCache, PagedMask
from mlx_paged.kv.row_attention import causal_row, chunk_rows_attention, row_shapes

_original = base.scaled_dot_product_attention
# The pool of the forward running now (`forward_on`), for KV-shared layers.
_active_pool = None

# Families whose attention does not go through base.scaled_dot_product_attention on the K/V the
# cache returns (mlx-lm 0.32), refused before the probe (`kv_layout.py`) runs them because no
# tiny model of theirs is built here to show its verdict; the families the tests build are
# refused by the probe alone, naming the layer (`test_model_support.REFUSED`).
UNSUPPORTED_MODEL_TYPES = {
    "olmo",
    "phi3small",
    "kimi_vl",
    "kimi_k3",
    "longcat_flash_ngram",
    "minimax_m3_vl",
}


def paged_scaled_dot_product_attention(
    queries, keys, values, cache, scale: float, mask, sinks: mx.array | None = None
) -> mx.array:
    """Drop-in for mlx-lm's `scaled_dot_product_attention` that understands paged caches.

    Decode steps (one query per row) run the generated kernel when the pool has a kernel
    backend (soft-capped and chunked scores too), the RoPE-fused one (`decode_rope_*`) when
    the step defers RoPE to attention.
    Prefill runs MLX's causal SDPA as mlx-lm does: over this forward's own K/V when every row
    starts at position 0, else row by row over the row's gathered context. Sliding windows
    narrower than the context, attention sinks and the CPU's decode run the reference. Every
    call is counted by path in `pool.attention_calls`.
    """
    if cache is None and _active_pool is not None:  # a KV-shared layer (Gemma 4)
        cache = _shared_source(keys)
    if not isinstance(cache, PagedLayerCache):
        _observe(cache, queries, keys, values, mask)
        return _original(queries, keys, values, cache, scale=scale, mask=mask, sinks=sinks)
    rules = mask if isinstance(mask, PagedMask) else PagedMask()
    if cache.metadata.rope_in_attention:
        if rules.softcap is not None or rules.chunk is not None:
            raise ValueError("soft-capped or chunked attention cannot be fused with RoPE")
        return _decode_with_rope(queries, keys, values, cache, scale, rules.window, sinks)
    if cache.metadata.decode_rows is not None:
        return _mixed(queries, keys, values, cache, scale, mask, sinks)
    return _paged(queries, keys, values, cache, scale, rules, sinks)


def _paged(queries, keys, values, cache, scale: float, rules: PagedMask, sinks) -> mx.array:
    """A decode or prefill forward's attention over the pages, by the first path that computes
    it exactly: the kernel, MLX's causal SDPA, or the reference."""
    meta, pool, window = cache.metadata, cache.pool, rules.window
    phase = "decode" if meta.num_query_tokens == 1 else "prefill"
    if phase == "decode" and pool.decode_backend is not None and sinks is None:
        return _kernel_decode(queries, cache, scale, window, rules.chunk, rules.softcap)
    # Soft-capped scores (gemma2) and chunks (llama4) have no MLX SDPA: the reference serves
    # their prefill.
    plain = sinks is None and rules.softcap is None and rules.chunk is None
    if phase == "prefill" and plain and _own_kv_suffices(meta, window, sinks):
        pool.attention_calls["causal", phase] += 1
        if pool.prefill_shapes is not None:
            return pool.prefill_shapes.attend_own(queries, keys, values, scale)
        return mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=scale, mask="causal"
        )
    if phase == "prefill" and plain and _causal_rows_suffice(meta, window, sinks):
        pool.attention_calls["causal_rows", phase] += 1
        return _causal_per_row(queries, cache, scale, pool)
    pool.attention_calls["reference", phase] += 1
    return paged_attention_reference(
        queries, cache.k_pages, cache.v_pages, meta.block_tables, meta.context_lens,
        meta.query_positions, scale=scale, window=window, sinks=sinks, softcap=rules.softcap,
        chunk=rules.chunk,
    )  # fmt: skip


def decode_rows_attention(queries, cache, scale: float, window: int | None) -> mx.array | None:
    """A plain decode step's attention as `(B, Hq * D)` rows, which an output projection reads
    with no reshape node: the generated kernel's, where the pool has one and the step is one
    query a row with no RoPE deferred to attention; else None (the caller takes the hook's
    `(B, Hq, 1, D)` output)."""
    meta = cache.metadata
    if cache.pool.decode_backend is None or meta.decode_rows is not None or meta.rope_in_attention:
        return None
    return _kernel_decode(queries, cache, scale, window, flat_output=True)


def _kernel_decode(queries, cache, scale, window, chunk=None, softcap=None, flat_output=False):
    """The generated decode kernel over `cache`'s pages, counted in `attention_calls`."""
    meta, pool = cache.metadata, cache.pool
    pool.attention_calls["kernel", "decode"] += 1
    return paged_attention_decode(
        queries, *cache.decode_pages, meta.block_tables, meta.context_lens, scale=scale,
        window=window, backend=pool.decode_backend, counters=pool.counters, chunk=chunk,
        softcap=softcap, block_size=pool.block_size, flat_output=flat_output,
    )  # fmt: skip


def _shared_source(keys):
    """The paged cache whose update returned `keys` in this forward, or None."""
    entry = _active_pool.fetched.get(id(keys))
    if entry is None or entry[0] is not keys:
        return None
    if entry[1].metadata.rope_in_attention:
        raise ValueError("a KV-shared layer cannot fuse RoPE into attention: use --fused-rope off")
    return entry[1]


@contextmanager
def forward_on(pool):
    """Run a forward over `pool`'s pages: KV-shared layers call attention without a cache, and
    are found through what the pool's caches returned (`pool.fetched`, dropped afterwards)."""
    global _active_pool
    _active_pool = pool
    try:
        yield
    finally:
        _active_pool = None
        pool.fetched.clear()


def active_pool():
    """The pool of the paged forward running now (`forward_on`), or None outside one."""
    return _active_pool


def _observe(cache, queries, keys, values, mask) -> None:
    """The layout probe at load sees attention calls through its own caches."""
    if hasattr(cache, "observe_attention"):
        cache.observe_attention(queries, keys, values, mask)


def _own_kv_suffices(meta, window: int | None, sinks) -> bool:
    """Rows that start at position 0 see only this forward's keys, causally: padding sits
    after each row's tokens, where causal masking hides it from them."""
    fits_window = window is None or window >= meta.num_query_tokens
    return meta.starts_at_zero and fits_window and sinks is None


def _causal_rows_suffice(meta, window: int | None, sinks) -> bool:
    longest = max((s + n for s, n, _ in meta.prefill_rows), default=0)
    return bool(meta.prefill_rows) and sinks is None and (window is None or window >= longest)


def _causal_per_row(queries: mx.array, cache, scale: float, pool) -> mx.array:
    """Each row's queries over its own gathered context (`causal_row`). Without bucketed
    shapes, a row's queries and keys are padded alike, to a multiple of `pool.prefill_align`
    queries: the end alignment keeps the padded keys out of the real queries' view."""
    width = queries.shape[2]
    align = 1 if row_shapes(pool) is not None else pool.prefill_align
    outs = []
    for row, (start, count, table) in enumerate(cache.metadata.prefill_rows):
        count = min(cdiv(count, align) * align, width)
        out = causal_row(queries[row : row + 1, :, :count], cache, start, table, scale)
        if count < width:
            out = mx.pad(out, ((0, 0), (0, 0), (0, width - count), (0, 0)))
        outs.append(out)
    return mx.concatenate(outs) if len(outs) > 1 else outs[0]


def _mixed(queries, keys, values, cache, scale: float, mask, sinks) -> mx.array:
    """A decode forward that also runs prefill chunks: its decode rows attend as a decode step
    does, then the chunk tokens as their chunks' prefill would (`chunk_rows_attention`)."""
    decode = cache.metadata.decode_rows
    rows = decode.context_lens.shape[0]
    step = PagedLayerCache(cache.pool, cache.layer, decode)
    head = paged_scaled_dot_product_attention(queries[:rows], None, None, step, scale, mask, sinks)
    rules = mask if isinstance(mask, PagedMask) else PagedMask()
    tail = chunk_rows_attention(queries[rows:], keys[rows:], values[rows:], cache, scale, rules,
                                sinks)  # fmt: skip
    return mx.concatenate([head, tail])


def _decode_with_rope(queries, keys, values, cache, scale, window, sinks) -> mx.array:
    """A decode step whose RoPE runs in attention: rotate, attend, then write the pages."""
    pool, meta = cache.pool, cache.metadata
    if sinks is not None:
        raise ValueError("attention sinks cannot be fused with RoPE; the paged setup refuses them")
    tables = (meta.block_tables, meta.context_lens)
    inv_freq = pool.rope_inv_freq[cache.layer]
    if pool.decode_backend is not None:
        pool.attention_calls["kernel_rope", "decode"] += 1
        out, rotated = paged_attention_decode_rope(
            queries, keys, values, *cache.decode_pages, *tables, scale=scale,
            rope_inv_freq=inv_freq, window=window, backend=pool.decode_backend,
            counters=pool.counters, block_size=pool.block_size,
        )  # fmt: skip
    else:
        pool.attention_calls["reference_rope", "decode"] += 1
        out, rotated = paged_attention_decode_rope_reference(
            queries, keys, values, cache.k_pages, cache.v_pages, *tables, scale=scale,
            rope_inv_freq=inv_freq, window=window,
        )  # fmt: skip
    pool.write(cache.layer, rotated, values, meta.slot_mapping)
    return out


def install_attention_hook() -> int:
    """Patch every loaded mlx-lm model module (call after `load`); returns how many."""
    patched = 0
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("mlx_lm.models.")
            and module is not None
            and getattr(module, "scaled_dot_product_attention", None) is _original
        ):
            module.scaled_dot_product_attention = paged_scaled_dot_product_attention
            patched += 1
    return patched


def check_model_supported(model_type: str) -> None:
    """Raise a clear error for model families the paged path would get wrong."""
    if model_type in UNSUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model type {model_type!r} does not run its attention through mlx-lm's "
            f"scaled_dot_product_attention, so the paged KV path cannot serve it; "
            f"use --kv-paged off"
        )
