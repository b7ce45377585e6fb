"""Whether decode steps fuse RoPE into attention for a loaded model, decided at load.

`defer_rope` checks each layer's RoPE on sample positions; then one probe decode step through
the fused reference on a scratch pool must give the logits of the unfused step, which catches
models that use the cache's positions for anything but their `rope` module.
"""

from __future__ import annotations

import logging

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import ArraysCache

from mlx_paged.kv.cache_plan import AttentionSlot, CachePlan
from mlx_paged.kv.kv_layout import KVLayout
from mlx_paged.kv.page_arrays import make_slot_mapping
from mlx_paged.kv.paged_cache import (
    PagedAttentionMetadata,
    PagedKVPool,
    PagedLayerCache,
)
from mlx_paged.kv.rope_fusion import defer_rope, restore_rope

logger = logging.getLogger(__name__)

_PROMPT = [1, 2, 3]


def enable_fused_rope(model, layout: KVLayout, pool: PagedKVPool, mode: str) -> bool:
    """Set `pool.rope_inv_freq` when decode steps will fuse RoPE into attention.

    "auto" fuses when decode runs the generated kernel and the model qualifies; "on" also on
    the reference path (which gains nothing; for tests), and raises when the model does not
    qualify; "off" never fuses.
    """
    if mode == "off" or (mode == "auto" and pool.decode_backend is None):
        return False
    if pool.quantized:  # the decode_rope kernels hand back a 16-bit key to write
        if mode == "on":
            raise ValueError("fused RoPE writes 16-bit pages; use --kv-bits 16 with it")
        logger.info("decode attention without fused RoPE: the pages are quantized")
        return False
    if len(layout.by_shape()) > 1 or layout.values_differ:
        if mode == "on":
            raise ValueError(
                "fused RoPE needs one K/V shape in every attention layer, V heads of the K size"
            )
        logger.info("decode attention without fused RoPE: layers cache K/V of several shapes")
        return False
    freqs = defer_rope(model, layout.head_dim)
    if freqs is None:
        reason = "its RoPE is not a rotation the decode_rope kernels express"
    else:
        reason = _probe(model, layout, pool.block_size, freqs)
    if reason is not None:
        restore_rope(model)
        if mode == "on":
            raise ValueError(f"fused RoPE is not possible for this model: {reason}")
        logger.info("decode attention without fused RoPE: %s", reason)
        return False
    pool.rope_inv_freq = freqs
    logger.info("decode attention applies RoPE in the kernel (decode_rope_*)")
    return True


def _probe(model, layout: KVLayout, block_size: int, freqs: list[mx.array]) -> str | None:
    """None when a decode step with RoPE fused gives the unfused step's logits, else why not."""
    try:
        unfused = _probe_logits(model, layout, block_size, None)
        fused = _probe_logits(model, layout, block_size, freqs)
    except Exception as exc:  # noqa: BLE001 - any failure of the fused step disqualifies
        return f"a probe decode step failed ({type(exc).__name__}: {exc})"
    scale = max(1.0, mx.abs(unfused).max().item())
    if not mx.allclose(fused, unfused, atol=2e-2 * scale, rtol=0).item():
        return "a probe decode step gave other logits than the unfused step"
    return None


def _probe_logits(model, layout: KVLayout, block_size: int, freqs) -> mx.array:
    """Logits of a 3-token prefill then one decode step on a scratch pool of 2 blocks."""
    pool = PagedKVPool(layout.num_layers, 3, block_size, layout.num_kv_heads, layout.head_dim,
                       layout.dtype)  # fmt: skip
    pool.rope_inv_freq = freqs
    tables = mx.array([[1, 2]], dtype=mx.int32)
    n = len(_PROMPT)
    steps = (
        (mx.array([_PROMPT]), [0], np.arange(n), False),
        (mx.array([[4]]), [n], np.array([n]), freqs is not None),
    )
    plan = layout.plan or CachePlan([AttentionSlot(i) for i in range(layout.num_layers)])
    states = [ArraysCache(size) for size in plan.state_sizes]  # carried from step to step
    for tokens, start, positions, fused in steps:
        meta = PagedAttentionMetadata(
            block_tables=tables,
            context_lens=mx.array([start[0] + tokens.shape[1]], dtype=mx.int32),
            offsets=mx.array(start, dtype=mx.int32),
            slot_mapping=make_slot_mapping(block_size + positions),
            num_query_tokens=tokens.shape[1],
            rope_in_attention=fused,
        )
        caches = plan.build(lambda i, m=meta: PagedLayerCache(pool, i, m), states.__getitem__)
        logits = model(tokens, cache=caches)
    return logits[:, -1, :].astype(mx.float32)
