"""Decode steps whose RoPE runs inside the attention kernel (`decode_rope_*`).

Each attention layer's `rope` is wrapped in a `DeferredRoPE`. In a decode step that fuses RoPE,
the paged cache hands the model a `DeferredOffset` instead of the positions; the wrapper then
returns its input unrotated, the cache does not write, and the attention hook gives the kernel
the step's raw query, key and value plus the layer's RoPE frequencies, then writes the rotated
key it returns. Every other call rotates as before.

A family qualifies when every layer's RoPE is the non-interleaved rotation by
`position * inv_freq` (nn.RoPE, and mlx-lm's variants built on `mx.fast.rope` with `freqs`),
checked numerically, and a probe decode step through the fused reference gives the model's own
logits. Others keep the unfused path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.paged_attention_reference import rotate_half_rope

logger = logging.getLogger(__name__)

_ATTENTION_NAMES = ("self_attn", "attention", "attn")
_PROBE_POSITIONS = (0, 1, 7, 100, 1000)
# A wrong base, scale or layout is off by O(1); float32 angles of ~1000 rad computed two ways
# differ by up to 1e-4 rad.
_PROBE_TOLERANCE = 2e-3


@dataclass(frozen=True)
class DeferredOffset:
    """The positions of a decode step whose RoPE the attention kernel applies."""

    positions: mx.array


class DeferredRoPE:
    """A layer's RoPE that leaves its input unrotated when given a `DeferredOffset`.

    A plain object rather than an `nn.Module`, so the model's parameter tree loses only the
    wrapped RoPE, which holds no parameters.
    """

    def __init__(self, rope, inv_freq: mx.array):
        self.rope = rope
        self.inv_freq = inv_freq  # (rotated dims / 2,) float32

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        if isinstance(offset, DeferredOffset):
            return x
        return self.rope(x, offset=offset)


def attention_modules(model) -> list | None:
    """Each layer's attention module (the one holding `rope`), or None if some layer has none."""
    found = []
    for layer in getattr(model, "layers", None) or []:
        attn = next((getattr(layer, n) for n in _ATTENTION_NAMES if hasattr(layer, n)), None)
        if attn is None or not callable(getattr(attn, "rope", None)):
            return None
        found.append(attn)
    return found or None


def rope_inv_freq(rope, head_dim: int) -> mx.array | None:
    """The per-pair angle of `rope` as `decode_rope_*` kernels take it, or None when the module
    is not a non-interleaved rotation by `position * inv_freq` (checked on sample positions)."""
    inv = _candidate_inv_freq(rope)
    if inv is None or 2 * inv.shape[0] > head_dim:
        return None
    x = mx.random.normal((len(_PROBE_POSITIONS), 2, 1, head_dim), key=mx.random.key(0))
    positions = mx.array(_PROBE_POSITIONS)
    try:
        theirs = mx.concatenate(
            [rope(x[i : i + 1], offset=p) for i, p in enumerate(_PROBE_POSITIONS)]
        )
    except Exception:  # noqa: BLE001 - any failure means: not a rotation we can express
        return None
    ours = rotate_half_rope(x, positions, inv)
    close = mx.allclose(theirs, ours, atol=_PROBE_TOLERANCE, rtol=_PROBE_TOLERANCE).item()
    return inv if close else None


def _candidate_inv_freq(rope) -> mx.array | None:
    if getattr(rope, "traditional", False) or not isinstance(getattr(rope, "dims", None), int):
        return None
    dims = rope.dims
    freqs = getattr(rope, "_freqs", None)
    if isinstance(freqs, mx.array):
        return (1.0 / freqs.astype(mx.float32)).astype(mx.float32)
    base, scale = getattr(rope, "base", None), getattr(rope, "scale", 1.0)
    if base is None:
        return None
    exponents = np.arange(0, dims, 2, dtype=np.float64) / dims
    return mx.array(scale * base**-exponents, dtype=mx.float32)


def defer_rope(model, head_dim: int) -> list[mx.array] | None:
    """Wrap every layer's RoPE in a `DeferredRoPE`; returns each layer's frequencies, or None
    (and changes nothing) when some layer's RoPE cannot be expressed."""
    modules = attention_modules(model)
    if modules is None:
        return None
    ropes = [m.rope.rope if isinstance(m.rope, DeferredRoPE) else m.rope for m in modules]
    freqs = [rope_inv_freq(rope, head_dim) for rope in ropes]
    if any(f is None for f in freqs):
        return None
    for module, rope, inv in zip(modules, ropes, freqs):
        module.rope = DeferredRoPE(rope, inv)
    mx.eval(freqs)
    return freqs


def restore_rope(model) -> None:
    """Undo `defer_rope`."""
    for module in attention_modules(model) or []:
        if isinstance(module.rope, DeferredRoPE):
            module.rope = module.rope.rope
