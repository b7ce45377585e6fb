"""Pure-MLX multi-head latent attention (MLA) over latent pages.

An MLA layer's page row holds one token's compressed latent (`R` values, e.g. 512) and its RoPE
key part (`P` values, e.g. 64), shared by every query head. Decode runs in the absorbed form, as
mlx-lm's MLA code does for one query token: queries already projected into the latent space
score `q_latent . latent + q_rope . rope`, and the output is the softmax-weighted sum of the
latent rows, which the model projects back per head. This file is the oracle of the MLA decode
kernel and the CPU's path.
"""

from __future__ import annotations

import mlx.core as mx

from mlx_paged.kernels.paged_attention_reference import gather_kv, paged_attention_mask


def rope_scores(q_rope: mx.array, rope: mx.array, mask: mx.array, scale: float) -> mx.array:
    """The RoPE part of the scores, `(q_rope * scale) @ rope^T`, with invisible keys at the
    dtype's lowest value: mlx-lm's `pe_scores`, which its MLA code hands SDPA as an additive
    mask. `q_rope` `(B, H, L, P)`, `rope` `(B, 1, T, P)`, boolean `mask` `(B, 1, L, T)`."""
    scores = (q_rope * scale) @ rope.swapaxes(-1, -2)
    return mx.where(mask, scores, mx.array(mx.finfo(scores.dtype).min, scores.dtype))


def latent_attention_reference(
    q_latent: mx.array,
    q_rope: mx.array,
    latent_pages,
    rope_pages,
    block_tables: mx.array,
    context_lens: mx.array,
    query_positions: mx.array,
    *,
    scale: float,
    mask: mx.array | None = None,
) -> mx.array:
    """Absorbed-form attention of `(B, H, L, R)` latent queries and `(B, H, L, P)` RoPE queries
    over paged latent rows; returns `(B, H, L, R)`, still in the latent space.

    Args:
        latent_pages, rope_pages: `[num_blocks, block_size, 1, R]` and `[..., 1, P]` pages.
        block_tables: `(B, max_blocks)` int32; unused entries point at the null block 0.
        context_lens: `(B,)` tokens of each row in the cache, this step's included.
        query_positions: `(B, L)` position of each query token.
        scale: softmax scale of the full query head (`(nope + rope dims) ** -0.5`, or the
            model's own).
        mask: `(B, 1, L, T)` keys each query sees (a sparse selection); None: every key up
            to its position.
    """
    latent, rope = gather_kv(latent_pages, rope_pages, block_tables)
    if mask is None:
        mask = paged_attention_mask(query_positions, context_lens, latent.shape[2])
    bias = rope_scores(q_rope, rope, mask, scale)
    return mx.fast.scaled_dot_product_attention(q_latent, latent, latent, scale=scale, mask=bias)
