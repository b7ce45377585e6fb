"""What each of a model's caches keeps, read from mlx-lm's `make_cache`: K/V (an attention layer,
served from pages) or fixed-size arrays (a recurrent, SSM or convolution layer, served from
state slots), possibly several per layer (`CacheList`).

A `CachePlan` rebuilds the model's cache structure for every forward with paged stand-ins, so
the runner and the layout probe hand mlx-lm's own model code the objects it expects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mlx_lm.models.cache import ArraysCache, CacheList, ChunkedKVCache, KVCache, RotatingKVCache

_OFF = "use --kv-paged off"


@dataclass(frozen=True)
class AttentionSlot:
    """A K/V cache: the `index`th attention layer of the pool; `window`: the sliding window
    its `RotatingKVCache` keeps, None for a cache of every token."""

    index: int
    window: int | None = None


@dataclass(frozen=True)
class StateSlot:
    """An `ArraysCache` of `size` arrays: the `index`th state layer of the state pool."""

    index: int
    size: int


@dataclass(frozen=True)
class ListSlot:
    """A `CacheList`: several caches one layer keeps."""

    items: tuple


class CachePlan:
    """The model's caches as attention and state slots, in `make_cache` order.

    Args:
        entries: one `AttentionSlot`, `StateSlot` or `ListSlot` per top-level cache.
    """

    def __init__(self, entries: list):
        self.entries = entries
        self.num_attention = sum(1 for leaf in self._leaves() if isinstance(leaf, AttentionSlot))
        self.state_sizes = [leaf.size for leaf in self._leaves() if isinstance(leaf, StateSlot)]

    @property
    def num_state(self) -> int:
        return len(self.state_sizes)

    @property
    def windows(self) -> list[int | None]:
        """Per attention layer, in order, its sliding window (None: full attention)."""
        slots = sorted((s for s in self._leaves() if isinstance(s, AttentionSlot)),
                       key=lambda s: s.index)  # fmt: skip
        return [s.window for s in slots]

    def _leaves(self):
        stack = list(reversed(self.entries))
        while stack:
            entry = stack.pop()
            if isinstance(entry, ListSlot):
                stack.extend(reversed(entry.items))
            else:
                yield entry

    def build(self, attention: Callable[[int], object], state: Callable[[int], object]) -> list:
        """The caches of one forward: `attention(i)` for attention layer i, `state(j)` for
        state layer j, nested as the model's own."""

        def one(entry):
            if isinstance(entry, AttentionSlot):
                return attention(entry.index)
            if isinstance(entry, StateSlot):
                return state(entry.index)
            return CacheList(*(one(item) for item in entry.items))

        return [one(entry) for entry in self.entries]


def plan_caches(model) -> CachePlan:
    """The model's `CachePlan` (a plain K/V cache per layer when it has no `make_cache`).

    Raises:
        ValueError: a cache of a kind the paged path cannot hold, naming the layer.
    """
    if not hasattr(model, "make_cache"):
        return CachePlan([AttentionSlot(i) for i in range(len(model.layers))])
    counts = {"attention": 0, "state": 0}
    # Chunked attention is K/V on pages where an adapter gives its layers chunked masks.
    from mlx_paged.kv.attention_adapters import serves_chunked_attention

    paged_kinds = (KVCache, RotatingKVCache)
    if serves_chunked_attention(model):
        paged_kinds += (ChunkedKVCache,)

    def one(cache, layer: int):
        if isinstance(cache, paged_kinds):
            counts["attention"] += 1
            window = cache.max_size if isinstance(cache, RotatingKVCache) else None
            return AttentionSlot(counts["attention"] - 1, window)
        if type(cache) is ArraysCache:
            counts["state"] += 1
            return StateSlot(counts["state"] - 1, len(cache.cache))
        if isinstance(cache, CacheList):
            return ListSlot(tuple(one(c, layer) for c in cache.caches))
        raise ValueError(
            f"layer {layer} keeps a {type(cache).__name__}, a cache the paged KV path has no "
            f"pages or state slots for: {_OFF}"
        )

    return CachePlan([one(cache, i) for i, cache in enumerate(model.make_cache())])
