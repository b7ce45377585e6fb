"""What a model's attention looks like to the paged path, found by running it.

The paged path can serve a model only when every layer caches K and V of one shape through
`update_and_fetch` and then attends through mlx-lm's `scaled_dot_product_attention` to exactly
the K and V the cache returned, with no mask array of its own: the attention hook reads the pages
instead and builds its own mask. A probe forward (one token, then two) with recording caches
checks that, and refuses anything else with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import KVCache, RotatingKVCache

PAGEABLE_CACHES = (KVCache, RotatingKVCache)
_OFF = "use --kv-paged off"


class _ProbeCache:
    """Records, for one layer, the K/V it caches and the attention calls that follow."""

    offset = 0

    def __init__(self, windows: set):
        self.windows = windows
        self.fetched: list[tuple[mx.array, mx.array]] = []
        self.attended: list[tuple] = []  # (queries shape, dtype, exact K/V, mask is an array)

    def update_and_fetch(self, keys, values):
        self.fetched.append((keys, values))
        return keys, values

    def observe_attention(self, queries, keys, values, mask) -> None:
        exact = bool(self.fetched) and keys is self.fetched[-1][0] and values is self.fetched[-1][1]
        self.attended.append((queries.shape[1], queries.dtype, exact, isinstance(mask, mx.array)))

    def make_mask(self, N, return_array=False, window_size=None):
        self.windows.add(window_size)
        return None


@dataclass(frozen=True)
class KVLayout:
    """What the paged pool and the decode kernels need to know about a model's attention."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: mx.Dtype
    num_heads: int | None  # query heads (None when they differ between layers)
    query_dtype: mx.Dtype | None
    sliding_window: bool  # some layer attends through a sliding window


def _check_cache_types(model) -> None:
    if not hasattr(model, "make_cache"):
        return
    kinds = {type(c).__name__ for c in model.make_cache() if not isinstance(c, PAGEABLE_CACHES)}
    if kinds:
        raise ValueError(
            f"this model's layers keep state other than a K/V cache "
            f"({', '.join(sorted(kinds))}: recurrent, convolution or compressed "
            f"state), which the paged KV path cannot hold: {_OFF}"
        )


def _probe(model, num_tokens: int, windows: set) -> list[_ProbeCache]:
    caches = [_ProbeCache(windows) for _ in range(len(model.layers))]
    try:
        mx.eval(model(mx.zeros((1, num_tokens), dtype=mx.int32), cache=caches))
    except Exception as exc:  # a layer that needs a cache of another kind
        raise ValueError(
            f"this model's forward fails with a plain per-layer K/V cache "
            f"({type(exc).__name__}: {exc}), so the paged KV path cannot serve it: "
            f"{_OFF}"
        ) from exc
    for i, cache in enumerate(caches):
        if len(cache.fetched) != 1 or len(cache.attended) != 1:
            raise ValueError(
                f"layer {i} cached K/V {len(cache.fetched)} times and attended "
                f"through mlx-lm's scaled_dot_product_attention "
                f"{len(cache.attended)} times per forward (the paged path needs "
                f"once each): {_OFF}"
            )
        _, _, exact, mask_array = cache.attended[0]
        if not exact:
            raise ValueError(
                f"layer {i} attends to K/V other than the ones it cached (computed "
                f"from them afterwards), which paged attention cannot read from "
                f"the pages: {_OFF}"
            )
        if mask_array:
            raise ValueError(
                f"layer {i} attends with a mask array of its own, which paged "
                f"attention would ignore: {_OFF}"
            )
    return caches


def probe_kv_layout(model) -> KVLayout:
    """The K/V layout the model writes, seen on one- and two-token forwards.

    Raises:
        ValueError: the model cannot run on the paged path, saying why and what to use instead.
    """
    _check_cache_types(model)
    windows: set = set()
    _probe(model, 2, windows)
    caches = _probe(model, 1, windows)
    seen = [c.fetched[0] for c in caches]
    shapes = {(k.shape[1], k.shape[3], v.shape[3]) for k, v in seen}
    if len(shapes) != 1:
        raise ValueError(
            f"the paged KV path needs every layer to cache K/V of one shape; "
            f"this model's layers give {sorted(shapes)}: {_OFF}"
        )
    heads, k_dim, v_dim = shapes.pop()
    if k_dim != v_dim:
        raise ValueError(f"the paged KV path needs equal K and V head sizes: {_OFF}")
    queries = {c.attended[0][:2] for c in caches}
    num_heads, q_dtype = queries.pop() if len(queries) == 1 else (None, None)
    return KVLayout(
        len(seen),
        heads,
        k_dim,
        seen[0][0].dtype,
        num_heads,
        q_dtype,
        any(w is not None for w in windows),
    )
