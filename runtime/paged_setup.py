"""Size and build the paged KV path for a loaded model."""

from __future__ import annotations

import logging
import os
from typing import Optional

import mlx.core as mx

from .attention_hook import check_model_supported, install_attention_hook
from .kv_cache_manager import KVCacheManager
from .paged_cache import PagedKVPool
from .paged_runner import PagedRunner

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_FRACTION = 0.10


def device_memory_bytes() -> int:
    """The accelerator's memory, or the machine's RAM on the CPU backend."""
    info = mx.device_info()
    if info.get("memory_size"):
        return int(info["memory_size"])
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


class _ProbeCache:
    """Records the K/V shape and dtype each layer produces, on a one-token forward."""

    offset = 0

    def __init__(self, sink: list):
        self.sink = sink

    def update_and_fetch(self, keys, values):
        self.sink.append((keys.shape[1], keys.shape[3], values.shape[3], keys.dtype))
        return keys, values

    def make_mask(self, N, return_array=False, window_size=None):
        return None


def probe_kv_layout(model) -> tuple[int, int, int, mx.Dtype]:
    """(num_layers, num_kv_heads, head_dim, dtype) of the K/V the model writes."""
    seen: list = []
    caches = [_ProbeCache(seen) for _ in range(len(model.layers))]
    mx.eval(model(mx.array([[0]]), cache=caches))
    shapes = {s[:3] for s in seen}
    if len(seen) != len(model.layers) or len(shapes) != 1:
        raise ValueError(f"the paged KV path needs every layer to cache K/V of one shape; "
                         f"this model's layers give {sorted(shapes)}: use --kv-paged off")
    heads, k_dim, v_dim = shapes.pop()
    if k_dim != v_dim:
        raise ValueError("the paged KV path needs equal K and V head sizes: use --kv-paged off")
    return len(seen), heads, k_dim, seen[0][3]


def build_paged_path(model, model_type: str, *, block_size: int,
                     kv_budget_bytes: Optional[int], num_blocks: Optional[int],
                     enable_prefix_caching: bool, max_num_tokens: Optional[int] = None
                     ) -> tuple[PagedRunner, KVCacheManager]:
    """Check the model, size the pool and return (runner, kv manager).

    The pool is `num_blocks`, else `kv_budget_bytes`, else 10% of device memory but never more
    than `max_num_tokens` (all sequences at full context) could use.
    """
    check_model_supported(model_type)
    install_attention_hook()
    num_layers, heads, head_dim, dtype = probe_kv_layout(model)
    block_bytes = 2 * num_layers * block_size * heads * head_dim * dtype.size
    if num_blocks is None:
        budget = kv_budget_bytes
        if budget is None:
            budget = int(device_memory_bytes() * DEFAULT_MEMORY_FRACTION)
            if max_num_tokens is not None:
                budget = min(budget, (max_num_tokens // block_size + 2) * block_bytes)
        num_blocks = budget // block_bytes
    if num_blocks < 2:
        raise ValueError(f"the KV budget holds {num_blocks} blocks of {block_bytes} bytes; "
                         f"it needs at least 2: raise --kv-budget")
    pool = PagedKVPool(num_layers, num_blocks, block_size, heads, head_dim, dtype)
    kv = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
    logger.info("paged KV: %d blocks x %d tokens (%.1f MiB, %d B/token), prefix caching %s",
                num_blocks, block_size, pool.nbytes / 2**20, block_bytes // block_size,
                "on" if enable_prefix_caching else "off")
    return PagedRunner(model, pool, kv), kv
