"""The model split at its logits head, so a forward can keep only the rows whose logits it
needs: a decode forward that carries prefill chunks samples from its decode rows alone, and
the chunk tokens' logits (vocabulary-wide, one row per token) would be computed for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class LogitsHead:
    """`body(tokens, cache=...)` gives the hidden states whose `head` are the model's logits."""

    body: Callable[..., mx.array]
    head: Callable[[mx.array], mx.array]


def split_logits_head(model) -> LogitsHead | None:
    """The split of an mlx-lm model whose logits are its inner `model`'s hidden states through
    `lm_head` or the tied embedding (of its `language_model`, for wrappers), checked on a few
    tokens against the whole model; None for any other shape (a softcap, a custom head), whose
    callers keep the whole forward."""
    text = getattr(model, "language_model", model)
    inner = getattr(text, "model", None)
    if inner is None or not callable(inner):
        return None
    heads = []
    if callable(getattr(text, "lm_head", None)):
        heads.append(text.lm_head)
    embed = getattr(inner, "embed_tokens", None)
    if hasattr(embed, "as_linear"):
        heads.append(embed.as_linear)
    probe = mx.array([[1, 2, 3]])
    try:
        whole = model(probe)
        hidden = inner(probe, cache=None)
    except Exception:  # a probe: an inner model that wants other inputs splits no head
        return None
    for head in heads:
        logits = head(hidden)
        if logits.shape == whole.shape and mx.array_equal(logits, whole).item():
            return LogitsHead(inner, head)
    return None
