"""The lean decode step with each layer's small ops fused (`--lean-decode fused`).

`LeanDecode` still spends a residual add and an RMSNorm where one node would do, a split and
three nodes of SwiGLU, and a reshape, a split and two RoPE nodes (four more RMSNorm-related ones
for qwen3) to get rotated heads out of the stacked q/k/v projection. `FusedDecode` runs the same
blocks as: the add and the next norm in one kernel (`add_rms_norm`), the heads cut, normed and
rotated in one (`qkv_rope`, which hands the page write its rows as they are, or on CUDA writes
them into the pages itself), and SwiGLU read from the stacked gate/up output in one (`swiglu`),
and the attention kernel hands back rows the output projection reads as they are: a llama layer
is then 11 graph nodes, 9 on CUDA (`mlx-paged bench ops`). The kernels run where the pool's
decode backend is a GPU; elsewhere each call is its MLX reference, which is mlx-lm's own ops, so
the step's tokens are mlx-lm's.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from mlx_paged.kernels.layer_kernels import add_rms_norm, qkv_rope, qkv_rope_into_pages, swiglu
from mlx_paged.kv.attention_hook import decode_rows_attention, paged_scaled_dot_product_attention
from mlx_paged.kv.paged_cache import PagedMask
from mlx_paged.kv.rope_fusion import DeferredRoPE, rope_inv_freq

# The families whose blocks are pre-norm RMSNorm with plain RoPE'd attention (gemma3's norms
# and ministral3's query scaling keep `LeanDecode`'s ops).
FUSED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "qwen2_moe", "qwen3_moe",
                  "mixtral")  # fmt: skip


@dataclass(frozen=True)
class FusedLayer:
    """One block as `FusedDecode` runs it: `qkv(x)` the stacked projection `(B, (H + 2 Hkv) *
    D)` of `heads` (H, Hkv, D), `inv_freq` its RoPE, `norms` qwen3's (q weight, k weight, eps)
    or None, `gate_up(x)` a dense SwiGLU's stacked gate/up output, `mlp` the block's feed-forward
    module (its `down_proj` after `swiglu` where dense; called as it is, a mixture of experts,
    where `gate_up` is None)."""

    block: object
    qkv: object
    heads: tuple[int, int, int]
    inv_freq: mx.array
    norms: tuple[mx.array, mx.array, float] | None
    gate_up: object | None
    mlp: object


class FusedDecode:
    """`decoder(tokens, caches)`: as `LeanDecode`, through `FusedLayer`s."""

    def __init__(self, inner, layers: list[FusedLayer], windows: list[int | None]):
        self.inner, self.layers, self.windows = inner, layers, windows

    def __call__(self, tokens: mx.array, caches: list) -> mx.array:
        backend = caches[0].pool.decode_backend
        h = self.inner.embed_tokens(tokens)
        x = self.layers[0].block.input_layernorm(h)
        r = None
        for layer, cache, window in zip(self.layers, caches, self.windows):
            block = layer.block
            if r is not None:
                h, x = _add_norm(h, r, block.input_layernorm, backend)
            a = _attention(layer, x, cache, window, backend)
            h, x = _add_norm(h, a, block.post_attention_layernorm, backend)
            r = _feed_forward(layer, x, backend)
        return _add_norm(h, r, self.inner.norm, backend)[1]


def _add_norm(h: mx.array, r: mx.array, norm, backend: str | None):
    return add_rms_norm(h, r, norm.weight, norm.eps, backend)


def _attention(layer: FusedLayer, x: mx.array, cache, window: int | None, backend) -> mx.array:
    """The block's attention of normed `(B, D)` inputs through its output projection: the new
    K/V written to the pages as `(B, Hkv, D)` rows, then the pages' decode attention."""
    y = layer.qkv(x)
    meta, attn = cache.metadata, layer.block.self_attn
    pages = _pages_written_in_place(cache, y.dtype, backend)
    if pages is not None:
        q = qkv_rope_into_pages(y, meta.offsets, layer.inv_freq, layer.heads, backend,
                                layer.norms, pages, meta.slot_mapping.slots)  # fmt: skip
        return attn.o_proj(decode_rows_attention(q, cache, attn.scale, window))
    if backend is None:
        q, k, v = _qkv_reference(layer, y, meta.offsets)
    else:
        q, k, v = qkv_rope(y, meta.offsets, layer.inv_freq, layer.heads, backend, layer.norms)
    cache.pool.write(cache.layer, k, v, meta.slot_mapping)
    rows = decode_rows_attention(q, cache, attn.scale, window)
    if rows is not None:
        return attn.o_proj(rows)
    if meta.decode_rows is not None:  # prefill chunk rows ride along: they attend to theirs too
        k, v = k[:, :, None], v[:, :, None]
    out = paged_scaled_dot_product_attention(q, k, v, cache, scale=attn.scale,
                                             mask=PagedMask(window))  # fmt: skip
    return attn.o_proj(out.reshape(x.shape[0], -1))


def _pages_written_in_place(cache, dtype: mx.Dtype, backend: str | None):
    """The layer's flat K and V pages for `qkv_rope` to write this step's rows into in place:
    on CUDA, in a plain decode step over 16-bit pages of `dtype` in the layer's own shape.
    Elsewhere (None) the pool scatters the rows. CUDA runs the steps' kernels in one stream's
    order; MLX's Metal backend orders kernels only through outputs, so nothing there would
    keep this write behind the last step's reads of the same pages."""
    pool, meta = cache.pool, cache.metadata
    plain = meta.decode_rows is None and meta.num_query_tokens == 1 and not meta.rope_in_attention
    if backend != "cuda" or pool.quantized or not plain or pool.layer_views[cache.layer]:
        return None
    k, v = pool.flat_side(cache.layer, 0), pool.flat_side(cache.layer, 1)
    return (k, v) if k.dtype == dtype == v.dtype else None


def rotated_heads(attn, y: mx.array, heads: tuple[int, int, int], offset):
    """Queries, keys and values `(B, heads, 1, D)` of the stacked q/k/v output `y` (`heads` =
    (H, Hkv, D)), queries and keys normed where `attn` norms them (qwen3, gemma3) and rotated at
    `offset`, by the module's own calls (what mlx-lm computes)."""
    num_heads, num_kv_heads, head_dim = heads
    y = y.reshape(y.shape[0], num_heads + 2 * num_kv_heads, 1, head_dim)
    q, k, v = mx.split(y, [num_heads, num_heads + num_kv_heads], axis=1)
    if hasattr(attn, "q_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    return attn.rope(q, offset=offset), attn.rope(k, offset=offset), v


def _qkv_reference(layer: FusedLayer, y: mx.array, offsets: mx.array):
    """`qkv_rope` by the module's own norms and RoPE: keys and values as the write's rows."""
    q, k, v = rotated_heads(layer.block.self_attn, y, layer.heads, offsets)
    rows = (y.shape[0], *layer.heads[1:])
    return q, k.reshape(rows), v.reshape(rows)


def _feed_forward(layer: FusedLayer, x: mx.array, backend: str | None) -> mx.array:
    if layer.gate_up is None:
        return layer.mlp(x)
    return layer.mlp.down_proj(swiglu(layer.gate_up(x), backend))


def fused_layer(lean) -> FusedLayer | str:
    """The `FusedLayer` of a `LeanLayer`, or why its block does not fuse."""
    block = lean.block
    attn = block.self_attn
    if lean.stacked_qkv is None:
        return "its attention is not stacked q/k/v heads"
    norms = [block.input_layernorm, block.post_attention_layernorm]
    qk_norms = None
    if hasattr(attn, "q_norm"):
        norms += [attn.q_norm, attn.k_norm]
        qk_norms = (attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps)
    if any(type(n) is not nn.RMSNorm for n in norms):
        return "its norms are not RMSNorm"
    if len({n.weight.dtype for n in norms}) > 1 or (qk_norms and attn.k_norm.eps != qk_norms[2]):
        return "its norms differ in weight dtype or in eps"
    rope = attn.rope.rope if isinstance(attn.rope, DeferredRoPE) else attn.rope
    inv_freq = rope_inv_freq(rope, lean.heads[2])
    if inv_freq is None:
        return "its RoPE is not a rotation the qkv_rope kernel expresses"
    mlp = block.mlp if "mlp" in block else block.block_sparse_moe  # mixtral's name
    mx.eval(inv_freq)
    return FusedLayer(block, lean.stacked_qkv, lean.heads, inv_freq, qk_norms, lean.gate_up, mlp)
