"""One matmul for the projections of a layer that read the same input.

A decode step's time is host time per graph node, and each projection is a matmul node and an
unflatten node. `fuse_projections` stacks the weights of such projections (rows after rows) into
one weight and gives each projection a view of its own rows back, so no weight is held twice
and the layer's own calls read the same memory; the fused call is one matmul whose output a
single split cuts into the projections' outputs (views, no copies).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

# Per linear kind, the arrays that stack row-wise, and the settings every part must share.
_ROW_ARRAYS = {
    nn.Linear: ("weight", "bias"),
    nn.QuantizedLinear: ("weight", "scales", "biases", "bias"),
}
_SETTINGS = {nn.Linear: (), nn.QuantizedLinear: ("group_size", "bits", "mode")}


class FusedProjections:
    """`fused(x)` is `[p(x) for p in projections]`, from one matmul (`fuse_projections`)."""

    def __init__(self, kind: type, arrays: dict[str, mx.array], splits: list[int], settings: dict):
        self._kind = kind
        self._arrays = arrays
        self._splits = splits
        self._settings = settings
        if kind is nn.Linear:  # an evaluated transpose: no transpose node at each call
            self._weight_t = arrays["weight"].T
            mx.eval(self._weight_t)

    @property
    def rows(self) -> list[int]:
        """Each projection's output size."""
        total = self._arrays["weight"].shape[0]
        ends = [*self._splits, total]
        return [end - start for start, end in zip([0, *self._splits], ends)]

    def __call__(self, x: mx.array) -> list[mx.array]:
        return mx.split(self.fused(x), self._splits, axis=-1)

    def fused(self, x: mx.array) -> mx.array:
        """Every projection's output side by side, from the one matmul."""
        arrays = self._arrays
        if self._kind is nn.Linear:
            y = x @ self._weight_t
        else:
            y = mx.quantized_matmul(
                x, arrays["weight"], scales=arrays["scales"], biases=arrays.get("biases"),
                transpose=True, **self._settings,
            )  # fmt: skip
        if "bias" in arrays:
            y = y + arrays["bias"]
        return y


def fuse_projections(projections: list[nn.Module]) -> FusedProjections | None:
    """Stack `projections` (linear layers of one kind and one input size) into one; each
    keeps views of its rows of the stacked arrays. None, with nothing changed, where they
    cannot be stacked (mixed kinds, quantization settings, biases or input sizes)."""
    kind = type(projections[0])
    if kind not in _ROW_ARRAYS or any(type(p) is not kind for p in projections):
        return None
    settings = {name: getattr(projections[0], name) for name in _SETTINGS[kind]}
    if any({n: getattr(p, n) for n in settings} != settings for p in projections):
        return None
    names = [n for n in _ROW_ARRAYS[kind] if n in projections[0]]
    if any([n for n in _ROW_ARRAYS[kind] if n in p] != names for p in projections):
        return None
    widths = {n: {p[n].shape[1:] for p in projections} for n in names}
    if any(len(shapes) != 1 for shapes in widths.values()):
        return None
    arrays = {n: mx.concatenate([p[n] for p in projections]) for n in names}
    mx.eval(arrays)
    rows = [p["weight"].shape[0] for p in projections]
    starts = [sum(rows[:i]) for i in range(len(rows) + 1)]
    for p, start, end in zip(projections, starts, starts[1:]):
        views = {n: arrays[n][start:end] for n in names}
        mx.eval(views)
        p.update(views)
    return FusedProjections(kind, arrays, starts[1:-1], settings)
