"""KV cache groups (vLLM's hybrid KV cache manager, for sliding windows): attention layers
grouped by what they keep, so a sliding-window layer's old pages go back to the pool.

Full-attention layers form group 0; sliding-window layers form further groups of the same
size. Each group has its own block table per request, and a block id is held by one group at a
time. The layers at the same place in their groups share one page array (`layer_array`): a
block of that array holds, for the group that owns the block, its layer's K/V. So one block
costs the same bytes in every group, all groups draw on the one pool, and a window group frees
the blocks its window left behind.

A group whose layers cache fewer K/V bytes a token (Gemma 4's global layers: another head size,
fewer KV heads) reads the shared arrays as `page_scale` times as many pages of its own shape:
its block b is pages b x scale ... b x scale + scale - 1 there, so its blocks hold scale times
the tokens (vLLM's block size per group: every block has the same bytes, none half empty).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVCacheGroups:
    """Per group its sliding window (None: full attention); per attention layer its group and
    the page array it shares."""

    windows: tuple[int | None, ...]
    layer_group: tuple[int, ...]
    layer_array: tuple[int, ...]
    page_scale: tuple[int, ...] = ()  # per group, pages a block holds; empty: 1 for every group

    def scale(self, group: int) -> int:
        """Pages of `group`'s shape per block of the shared arrays."""
        return self.page_scale[group] if self.page_scale else 1

    @property
    def scales(self) -> tuple[int, ...]:
        """Per group, pages a block holds."""
        return tuple(self.scale(g) for g in range(self.num_groups))

    @property
    def num_groups(self) -> int:
        return len(self.windows)

    @property
    def num_arrays(self) -> int:
        return max(self.layer_array) + 1

    @property
    def array_layers(self) -> list[int]:
        """Per page array, the first layer keeping its K/V there at the array's own shape (a
        layer of a group of page scale 1)."""
        first: dict[int, int] = {}
        for layer, array in enumerate(self.layer_array):
            if self.scale(self.layer_group[layer]) == 1:
                first.setdefault(array, layer)
        return [first[a] for a in range(self.num_arrays)]

    def read_at_another_shape(self, shapes: list) -> list[bool]:
        """Per layer of these `shapes` (any per-layer tuples), whether it reads its page array
        at another shape than the array's own (through a reshaped view)."""
        own = [shapes[layer] for layer in self.array_layers]
        return [s != own[a] for s, a in zip(shapes, self.layer_array)]

    @classmethod
    def single(cls, num_layers: int) -> KVCacheGroups:
        """Every layer in one group, each with its own pages."""
        return cls((None,), (0,) * num_layers, tuple(range(num_layers)))

    def describe(self) -> str:
        """ "full attention: 2 layers; sliding window 512: 10 layers in 5 groups" or the like."""
        parts = []
        for window in dict.fromkeys(self.windows):
            groups = [g for g, w in enumerate(self.windows) if w == window]
            layers = sum(1 for g in self.layer_group if g in groups)
            name = "full attention" if window is None else f"sliding window {window}"
            parts.append(f"{name}: {layers} layers in {len(groups)} group(s)")
        return "; ".join(parts)


def plan_groups(windows: list[int | None], shapes: list) -> tuple[KVCacheGroups, str | None]:
    """The groups for attention layers with these sliding `windows` and `shapes` (KV heads, K
    head size, query heads, V head size), and, where every layer stays in one group though some
    have windows, why."""
    single = KVCacheGroups.single(len(windows))
    window_layers = [i for i, w in enumerate(windows) if w is not None]
    if not window_layers:
        return single, None
    full = [i for i, w in enumerate(windows) if w is None]
    size = len(full) or len(window_layers)
    members = [full] if full else []
    members += [window_layers[i : i + size] for i in range(0, len(window_layers), size)]
    scales, why = _page_scales([[shapes[i] for i in m] for m in members])
    if why is not None:
        return single, why
    # A window group frees what its widest layer can no longer see.
    group_windows = tuple(None if m is full else max(windows[i] for i in m) for m in members)
    layer_group, layer_array = [0] * len(windows), [0] * len(windows)
    for g, m in enumerate(members):
        for place, layer in enumerate(m):
            layer_group[layer], layer_array[layer] = g, place
    page_scale = scales if any(s > 1 for s in scales) else ()
    return KVCacheGroups(group_windows, tuple(layer_group), tuple(layer_array), page_scale), None


def _page_scales(group_shapes: list[list[tuple]]) -> tuple[tuple[int, ...], str | None]:
    """Per group, how many pages of its shape one block of the shared arrays holds: 1 for the
    groups of the most bytes a token; a smaller shape must divide it, in K and in V alike, by
    a power of two."""
    if any(len(set(shapes)) > 1 for shapes in group_shapes):
        return (), "layers of one group cache K/V of several shapes"
    sizes = [(h * k, h * v) for (h, k, _, v), *_ in group_shapes]
    big_k, big_v = max(sizes)
    scales = []
    for k, v in sizes:
        scale = big_k // k
        if big_k % k or big_v % v or big_v // v != scale or scale & (scale - 1):
            return (), "its layers' K/V shapes do not divide one another"
        scales.append(scale)
    return tuple(scales), None
