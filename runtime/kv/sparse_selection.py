"""DeepSeek Sparse Attention's token selection on pages (deepseek_v32, glm_moe_dsa).

Each layer's indexer caches one key a token (`index_head_dim` values). On pages those keys are
an attention slot of their own, beside the layer's latent pages: their first half the K side,
their second half the V side, so a block holds them at no cost beyond their bytes. A query
attends only to the `index_topk` visible keys its indexer scores highest (all of them where a
row sees no more), as mlx-lm's `Indexer` selects them: scores `relu(q . k)` weighted per index
head and summed over the heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from mlx_paged.kernels.paged_attention_reference import gather_kv


@dataclass(frozen=True)
class SparseSelection:
    """One forward's indexer: its RoPE'd queries `(B, Hi, L, D)`, head weights `(B, Hi, L, 1)`,
    this forward's keys `(B, 1, L, D)`, its paged cache and `topk`."""

    queries: mx.array
    weights: mx.array
    new_keys: mx.array
    cache: object
    topk: int

    def keys(self, tables: mx.array) -> mx.array:
        """The index keys `(b, 1, T, D)` of the rows with block `tables` `(b, blocks)`."""
        first, second = gather_kv(self.cache.k_pages, self.cache.v_pages, tables)
        return mx.concatenate([first, second], axis=-1)

    def keep(self, queries, weights, keys, visible: mx.array) -> mx.array:
        """`visible` `(b, 1, L, T)` narrowed to each query's `topk` best-scored keys, for
        `queries` and `weights` (rows or chunk tokens of this forward) over `keys`."""
        if keys.shape[2] <= self.topk:  # no row sees more than it may keep
            return visible
        scores = mx.maximum(queries @ keys.swapaxes(-1, -2), 0) * weights
        if scores.shape[2] > 1:  # summed head by head, as mlx-lm sums a prompt's
            scores = sum(scores[:, h : h + 1] for h in range(scores.shape[1]))
        else:
            scores = scores.sum(axis=1, keepdims=True)
        scores = mx.where(visible, scores, -float("inf"))
        best = mx.argpartition(scores, kth=-self.topk, axis=-1)[..., -self.topk :]
        chosen = mx.put_along_axis(mx.zeros(scores.shape, mx.bool_), best, mx.array(True), -1)
        return visible & chosen


def index_selection(indexer, x: mx.array, qr: mx.array, cache, offset) -> SparseSelection:
    """The indexer's queries, weights and keys of `x` `(B, L, D)` (and the query LoRA `qr`), as
    mlx-lm's `Indexer` computes them; writes this forward's keys into `cache` (the probe's
    recording cache sees them attended once, as a layer's K/V)."""
    b, length, _ = x.shape
    q = indexer.wq_b(qr).reshape(b, length, indexer.n_heads, indexer.head_dim).swapaxes(1, 2)
    k = indexer.k_norm(indexer.wk(x)).reshape(b, 1, length, indexer.head_dim)
    q, k = indexer.rope(q, offset=offset), indexer.rope(k, offset=offset)
    half = indexer.head_dim // 2
    first, second = cache.update_and_fetch(k[..., :half], k[..., half:])
    if hasattr(cache, "observe_attention"):  # the load's probe
        cache.observe_attention(q, first, second, None, latent=True)
    weights = indexer.weights_proj(x) * (indexer.n_heads**-0.5 * indexer.softmax_scale)
    return SparseSelection(q, weights.swapaxes(-1, -2)[..., None], k, cache, indexer.index_topk)
