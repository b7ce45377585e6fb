"""The lean decode step's attention for multi-head latent attention (deepseek_v2, deepseek_v3,
kimi_k25, glm4_moe_lite): the MLA stand-in's projections on `(B, D)` activations, the query
LoRA's down projection and the latent one from one matmul of weights stacked at load, then the
latent pages' own attention (`kv/latent_attention.py`)."""

from __future__ import annotations

from functools import partial

import mlx.core as mx

from mlx_paged.kv.latent_attention import latent_attention
from mlx_paged.models.fused_projections import fuse_projections

# mlx-lm model types whose MLA layers the lean step runs (kimi_k25 is a deepseek_v3 inside).
LATENT_FAMILIES = ("deepseek_v2", "deepseek_v3", "kimi_k25", "glm4_moe_lite")


def latent_attend(attn):
    """`attend(x, cache, window, scale)` of an MLA module and its stacked input projections
    `(attend, stacked)`; None where they do not stack."""
    down = attn.q_proj if getattr(attn, "q_lora_rank", None) is None else attn.q_a_proj
    stacked = fuse_projections([down, attn.kv_a_proj_with_mqa])
    if stacked is None:
        return None
    return partial(_attend, attn, stacked.fused, stacked.rows[0]), stacked


def _attend(attn, stacked, q_rows: int, x: mx.array, cache, window, scale) -> mx.array:
    """As the MLA stand-in computes it (`latent_inputs`), for one token a row."""
    b = x.shape[0]
    q, kv = mx.split(stacked(x), [q_rows], axis=-1)
    if getattr(attn, "q_lora_rank", None) is not None:
        q = attn.q_b_proj(attn.q_a_layernorm(q))
    heads = attn.embed_q.weight.shape[0]
    q_nope, q_rope = mx.split(q.reshape(b, heads, 1, -1), [attn.qk_nope_head_dim], axis=-1)
    compressed, rope = mx.split(kv, [attn.kv_lora_rank], axis=-1)
    latent = attn.kv_a_layernorm(compressed).reshape(b, 1, 1, -1)
    offset = cache.offset
    q_rope, rope = attn.rope(q_rope, offset), attn.rope(rope.reshape(b, 1, 1, -1), offset)
    out = latent_attention(q_nope, q_rope, latent, rope, cache, attn)
    return attn.o_proj(out.reshape(b, -1))
