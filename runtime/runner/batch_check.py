"""Whether mlx-lm's batched caches give a model the tokens it gets alone.

Some model files ignore the padding that batching prompts of different lengths puts in their
caches (olmo_hybrid's convolution, for one), so their batched rows drift from the row run alone.
The contiguous path checks this once at load, on two short prompts of different lengths.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

# Prompts of different lengths, so the shorter one is padded in the batch.
_PROMPTS = ([1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 2, 1])
# Batched and lone logits differ by rounding only: far less than this share of their scale.
_TOLERANCE = 2e-2


def batching_is_exact(model, merge) -> bool:
    """True when a batch of `_PROMPTS` (prefilled, started, one decode step, as the contiguous
    path runs them with `merge`) gives each row the logits it gets alone."""
    together = _logits(model, merge, list(_PROMPTS))
    for row, prompt in enumerate(_PROMPTS):
        alone = _logits(model, merge, [prompt])
        scale = max(1.0, mx.abs(alone).max().item())
        if not mx.allclose(together[row : row + 1], alone, atol=_TOLERANCE * scale, rtol=0).item():
            return False
    return True


def _logits(model, merge, prompts: list[list[int]]) -> mx.array:
    """(rows, 2, V) float32 logits of each prompt's last token and of one greedy step after."""
    cache = merge([make_prompt_cache(model) for _ in prompts])
    chunks = [p[:-1] for p in prompts]
    width = max(len(c) for c in chunks)
    lengths = [len(c) for c in chunks]
    for c in cache:
        c.prepare(lengths=lengths, right_padding=[width - n for n in lengths])
    model(mx.array([c + [0] * (width - len(c)) for c in chunks]), cache=cache)
    for c in cache:
        c.finalize()
    first = model(mx.array([[p[-1]] for p in prompts]), cache=cache)[:, -1, :]
    second = model(mx.argmax(first, axis=-1)[:, None], cache=cache)[:, -1, :]
    return mx.stack([first, second], axis=1).astype(mx.float32)
