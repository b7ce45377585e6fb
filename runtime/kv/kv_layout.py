"""What a model's attention looks like to the paged path, found by running it.

The paged path can serve a model only when every attention layer caches its K and V (V heads
may be of another size than K's) through `update_and_fetch` and then attends through mlx-lm's
`scaled_dot_product_attention` to exactly the K and V the cache returned, with no mask array of
its own: the attention hook reads the pages instead and builds its own mask. Layers that keep
recurrent or convolution state (`ArraysCache`) get state slots; the probe records the arrays
they keep. A probe forward (one token, then two) with recording caches checks that, and refuses
anything else with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from mlx_paged.kv.cache_plan import CachePlan, plan_caches

_OFF = "use --kv-paged off"


class _ProbeCache:
    """Records, for one layer, the K/V it caches and the attention calls that follow."""

    offset = 0

    def __init__(self, windows: set):
        self.windows = windows
        self.fetched: list[tuple[mx.array, mx.array]] = []
        # (query heads, dtype, exact K/V, mask is an array, latent attention)
        self.attended: list[tuple] = []

    def update_and_fetch(self, keys, values):
        self.fetched.append((keys, values))
        return keys, values

    def observe_attention(self, queries, keys, values, mask, latent: bool = False) -> None:
        exact = bool(self.fetched) and keys is self.fetched[-1][0] and values is self.fetched[-1][1]
        masked = isinstance(mask, mx.array)
        self.attended.append((queries.shape[1], queries.dtype, exact, masked, latent))

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
    num_heads: int | None  # query heads (layer 0's when `layer_shapes` differ)
    query_dtype: mx.Dtype | None
    sliding_window: bool  # some layer attends through a sliding window
    plan: CachePlan | None = None  # the model's caches as attention and state slots
    # Per state layer, the (shape, dtype) of each array one request keeps.
    state: tuple = ()
    # Per attention layer, (KV heads, K head size, query heads, V head size); empty: every
    # layer's is the one of `num_kv_heads`, `head_dim`, `num_heads` and `value_head_dim` (those
    # are then layer 0's).
    layer_shapes: tuple = ()
    value_head_dim: int | None = None  # None: `head_dim`
    # Every attention layer is multi-head latent attention (`latent_attention.py`): K pages
    # hold the latent rows (one "head" of the latent size), V pages the RoPE keys.
    latent: bool = False

    @property
    def shapes(self) -> tuple:
        """Per attention layer, (KV heads, K head size, query heads, V head size)."""
        value_dim = self.value_head_dim or self.head_dim
        return (
            self.layer_shapes
            or ((self.num_kv_heads, self.head_dim, self.num_heads, value_dim),) * self.num_layers
        )

    @property
    def values_differ(self) -> bool:
        """Some layer's V head size is not its K head size (the SIMT decode kernels, and no
        others, take such layers)."""
        return any(k != v for _, k, _, v in self.shapes)

    @property
    def value_dim(self) -> int:
        """A uniform layout's V head size where it differs from K's, else 0 (`KernelSpec`'s
        `value_dim`)."""
        value = self.value_head_dim or self.head_dim
        return value if value != self.head_dim else 0

    def by_shape(self) -> list[KVLayout]:
        """One uniform layout per distinct layer shape (the kernels are chosen per shape)."""
        distinct = list(dict.fromkeys(self.shapes))
        if len(distinct) == 1:
            return [self]
        return [
            replace(self, num_kv_heads=h, head_dim=d, num_heads=q, value_head_dim=v,
                    layer_shapes=())
            for h, d, q, v in distinct
        ]  # fmt: skip


def _probe(model, plan: CachePlan, num_tokens: int, windows: set):
    """One forward of `num_tokens` with recording K/V caches and fresh state caches; returns
    both, checked."""
    caches = [_ProbeCache(windows) for _ in range(plan.num_attention)]
    states = [ArraysCache(size) for size in plan.state_sizes]
    try:
        tokens = mx.zeros((1, num_tokens), dtype=mx.int32)
        mx.eval(model(tokens, cache=plan.build(caches.__getitem__, states.__getitem__)))
    except Exception as exc:  # a layer that needs a cache of another kind
        raise ValueError(
            f"this model's forward fails with paged K/V caches and state slots "
            f"({type(exc).__name__}: {exc}), so the paged KV path cannot serve it: "
            f"{_OFF}"
        ) from exc
    for i, cache in enumerate(caches):
        _check_attention_layer(i, cache)
    for j, state in enumerate(states):
        if any(a is None for a in state.cache):
            raise ValueError(
                f"state layer {j} left some of its arrays unset after a forward, so its state "
                f"slot would be incomplete: {_OFF}"
            )
    return caches, states


def _check_attention_layer(i: int, cache: _ProbeCache) -> None:
    if len(cache.fetched) != 1 or len(cache.attended) != 1:
        raise ValueError(
            f"attention layer {i} cached K/V {len(cache.fetched)} times and attended "
            f"through mlx-lm's scaled_dot_product_attention "
            f"{len(cache.attended)} times per forward (the paged path needs "
            f"once each): {_OFF}"
        )
    _, _, exact, mask_array, _ = cache.attended[0]
    if not exact:
        raise ValueError(
            f"attention layer {i} attends to K/V other than the ones it cached (computed "
            f"from them afterwards), which paged attention cannot read from "
            f"the pages: {_OFF}"
        )
    if mask_array:
        raise ValueError(
            f"attention layer {i} attends with a mask array of its own, which paged "
            f"attention would ignore: {_OFF}"
        )


def probe_kv_layout(model) -> KVLayout:
    """The K/V layout the model writes, and the arrays its state layers keep, seen on one- and
    two-token forwards.

    Raises:
        ValueError: the model cannot run on the paged path, saying why and what to use instead.
    """
    plan = plan_caches(model)
    if plan.num_attention == 0:
        raise ValueError(f"this model has no attention layers, so it has no use for pages: {_OFF}")
    windows: set = set()
    _probe(model, plan, 2, windows)
    caches, states = _probe(model, plan, 1, windows)
    seen = [c.fetched[0] for c in caches]
    shapes = [(k.shape[1], k.shape[3], v.shape[3]) for k, v in seen]
    q_dtypes = {c.attended[0][1] for c in caches}
    q_dtype = q_dtypes.pop() if len(q_dtypes) == 1 else None
    layer_shapes = tuple((h, k, c.attended[0][0], v) for (h, k, v), c in zip(shapes, caches))
    heads, k_dim, num_heads, v_dim = layer_shapes[0]
    if len(set(layer_shapes)) == 1:
        layer_shapes = ()
    state = tuple(tuple((a.shape[1:], a.dtype) for a in s.cache) for s in states)
    latent = {c.attended[0][4] for c in caches}
    if len(latent) > 1:
        raise ValueError(f"this model mixes latent and per-head attention layers: {_OFF}")
    return KVLayout(
        len(seen),
        heads,
        k_dim,
        seen[0][0].dtype,
        num_heads,
        q_dtype,
        any(w is not None for w in windows),
        plan,
        state,
        layer_shapes,
        v_dim,
        latent.pop(),
    )
