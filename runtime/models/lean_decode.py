"""A decode step of fewer graph nodes for the llama family (llama, mistral, qwen2, qwen3, phi3).

MLX spends host time on every node of a step's graph, whatever the node does, so a decode
step's speed is set by its node count (`mlx-paged bench ops`). mlx-lm's layer runs three
matmuls for q, k and v and two for gate and up, each with the flatten and unflatten MLX adds
around a matmul of `(B, 1, D)` activations, and transposes every head layout. `LeanDecode` runs
the same layer on `(B, D)` activations (one token a row): q, k and v from one matmul of weights
stacked at load (`fuse_projections`: the layer's own projections keep views of their rows, so
nothing is held twice; phi3 stacks them itself), one reshape and one split into heads, gate and
up from one matmul too.
Norms, RoPE, the page writes and attention are the module's own calls and the attention hook's,
so the step computes what mlx-lm's forward computes on pages.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.activations import swiglu

from mlx_paged.kv.attention_hook import paged_scaled_dot_product_attention
from mlx_paged.kv.paged_cache import PagedMask
from mlx_paged.models.fused_projections import fuse_projections

logger = logging.getLogger(__name__)

# mlx-lm model types whose layers `LeanDecode` runs (mistral loads as llama).
LEAN_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3")


@dataclass(frozen=True)
class LeanLayer:
    """One transformer block and its stacked projections: `qkv(x)` the queries, keys and
    values side by side, `gate_up(x)` the MLP's gate and up halves."""

    block: object
    qkv: Callable[[mx.array], mx.array]
    gate_up: Callable[[mx.array], list[mx.array]]
    heads: tuple[int, int, int]  # query heads, KV heads, head size


class LeanDecode:
    """`decoder(tokens, caches)`: the hidden states `(B, D)` after the final norm, of one token
    a row (`tokens` `(B,)`) over paged `caches` (one a layer), with `windows[i]` the sliding
    window of layer i (None: full attention)."""

    def __init__(self, inner, layers: list[LeanLayer], windows: list[int | None]):
        self.inner, self.layers, self.windows = inner, layers, windows

    def __call__(self, tokens: mx.array, caches: list) -> mx.array:
        h = self.inner.embed_tokens(tokens)
        for layer, cache, window in zip(self.layers, caches, self.windows):
            h = _layer_step(layer, h, cache, window)
        return self.inner.norm(h)


def _layer_step(layer: LeanLayer, h: mx.array, cache, window: int | None) -> mx.array:
    """One block on `(B, D)` hidden states, as mlx-lm's block computes it for one token."""
    block, attn = layer.block, layer.block.self_attn
    num_heads, num_kv_heads, head_dim = layer.heads
    x = block.input_layernorm(h)
    y = layer.qkv(x).reshape(h.shape[0], num_heads + 2 * num_kv_heads, 1, head_dim)
    q, k, v = mx.split(y, [num_heads, num_heads + num_kv_heads], axis=1)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.rope(q, offset=cache.offset), attn.rope(k, offset=cache.offset)
    k, v = cache.update_and_fetch(k, v)
    out = paged_scaled_dot_product_attention(q, k, v, cache, scale=attn.scale,
                                             mask=PagedMask(window))  # fmt: skip
    h = h + attn.o_proj(out.reshape(h.shape[0], -1))
    gate, up = layer.gate_up(block.post_attention_layernorm(h))
    return h + block.mlp.down_proj(swiglu(gate, up))


def build_lean_decode(model, windows: list[int | None]) -> LeanDecode | None:
    """The lean decode step of `model` where its family and layers allow, stacking its q, k, v
    and gate, up weights (the model's own calls then read views of them); else None, logged.
    Build it before `cache_weight_views`, so those views are of the stacked weights."""
    family = getattr(model, "model_type", None)
    inner = getattr(model, "model", None)
    why = _refusal(family, inner, windows)
    if why is None:
        layers = [_lean_layer(block) for block in inner.layers]
        if any(layer is None for layer in layers):
            why = "its projections cannot be stacked (mixed kinds or quantization)"
    if why is not None:
        logger.info("decode steps run mlx-lm's forward: %s", why)
        return None
    logger.info("decode steps run the lean forward (%s, %d layers)", family, len(layers))
    return LeanDecode(inner, layers, windows)


def _refusal(family, inner, windows) -> str | None:
    if family not in LEAN_FAMILIES:
        return f"the lean forward covers {', '.join(LEAN_FAMILIES)}, not {family}"
    if inner is None or len(getattr(inner, "layers", ())) != len(windows):
        return "its layers are not one attention cache each"
    return None


def _lean_layer(block) -> LeanLayer | None:
    """`block`'s stacked projections (None, with nothing changed, where they do not stack);
    fused q, k, v first, so a refused gate/up leaves only q, k, v stacked (which mlx-lm's own
    calls read as views all the same)."""
    attn, mlp = block.self_attn, block.mlp
    if hasattr(attn, "qkv_proj"):  # phi3 keeps them stacked
        rows = attn.n_heads * attn.head_dim
        return LeanLayer(block, attn.qkv_proj, lambda x: mx.split(mlp.gate_up_proj(x), 2, -1),
                         (attn.n_heads, attn.n_kv_heads, rows // attn.n_heads))  # fmt: skip
    qkv = fuse_projections([attn.q_proj, attn.k_proj, attn.v_proj])
    gate_up = fuse_projections([mlp.gate_proj, mlp.up_proj]) if qkv is not None else None
    if gate_up is None:
        return None
    head_dim = qkv.rows[0] // attn.n_heads
    return LeanLayer(block, qkv.fused, gate_up, (attn.n_heads, attn.n_kv_heads, head_dim))
