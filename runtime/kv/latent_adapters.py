"""Paged stand-ins for mlx-lm's multi-head latent attention (MLA) modules.

mlx-lm's MLA code scores the RoPE part of its queries against the RoPE keys its cache returns
(all of them), which paged caches do not gather. Each stand-in projects exactly as its module
does, then hands the latent rows and both query parts to `latent_attention`, which writes the
latent pages and attends over them. Outside the paged path (no cache, mlx-lm's own caches) the
module runs as written.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import (
    bailing_hybrid,
    bailing_moe_v3,
    deepseek_v2,
    deepseek_v3,
    deepseek_v32,
    glm4_moe_lite,
    kimi_linear,
    longcat_flash,
    minicpm3,
    mistral4,
    youtu_llm,
)
from mlx_lm.models.mla import MultiLinear

from mlx_paged.kv.latent_attention import latent_attention
from mlx_paged.kv.paged_cache import PagedLayerCache
from mlx_paged.kv.sparse_selection import index_selection


def _on_pages(cache) -> bool:
    """A paged cache, or the layout probe's recording one."""
    return isinstance(cache, PagedLayerCache) or hasattr(cache, "observe_attention")


def latent_inputs(attn, x: mx.array, offset, qr: mx.array | None = None):
    """`(q_nope, q_rope, latent, rope)` of `x` `(B, L, D)`, projected, scaled and RoPE'd as the
    MLA module `attn` does: queries `(B, H, L, ...)`, latent rows `(B, 1, L, R)`, RoPE keys
    `(B, 1, L, P)`; `qr`: the query LoRA's normed output, where the caller has it."""
    b, length, _ = x.shape
    if getattr(attn, "q_lora_rank", None) is None:
        q = attn.q_proj(x)
    else:
        q = attn.q_b_proj(qr if qr is not None else attn.q_a_layernorm(attn.q_a_proj(x)))
    heads = attn.embed_q.weight.shape[0]
    q = q.reshape(b, length, heads, -1).transpose(0, 2, 1, 3)
    if getattr(attn, "mla_scale_q_lora", None) is not None:  # longcat_flash
        q = q * attn.mla_scale_q_lora
    q_nope, q_rope = mx.split(q, [attn.qk_nope_head_dim], axis=-1)
    compressed, rope = mx.split(attn.kv_a_proj_with_mqa(x), [attn.kv_lora_rank], axis=-1)
    rope = rope.reshape(b, length, 1, -1).transpose(0, 2, 1, 3)
    latent = attn.kv_a_layernorm(compressed)
    if getattr(attn, "mla_scale_kv_lora", None) is not None:
        latent = latent * attn.mla_scale_kv_lora
    if getattr(attn, "rope", None) is not None:  # kimi_linear's MLA rotates nothing
        q_rope, rope = attn.rope(q_rope, offset), attn.rope(rope, offset)
    return q_nope, q_rope, mx.expand_dims(latent, 1), rope


class LatentAttention:
    """An MLA module on latent pages; mixed in before the mlx-lm class it stands in for."""

    def prepare_pages(self) -> None:
        """Ready the module for latent pages once its class is swapped (here: nothing)."""

    def __call__(self, x, mask=None, cache=None):
        if not _on_pages(cache):
            return super().__call__(x, mask=mask, cache=cache)
        out = latent_attention(*latent_inputs(self, x, cache.offset), cache, self)
        return self.output(x, out.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1))

    def output(self, x, out):
        """The output projection of `out` `(B, L, H * V)`."""
        return self.o_proj(out)


class DenseOutput(LatentAttention):
    """MLA whose output projection is `dense` (bailing_hybrid)."""

    def output(self, x, out):
        return self.dense(out)


class GatedOutput(LatentAttention):
    """bailing_moe_v3's MLA: each head's output gated by `g_proj` before `dense`."""

    def output(self, x, out):
        b, length, _ = x.shape
        out = out.reshape(b, length, self.embed_q.weight.shape[0], -1)
        gate = mx.sigmoid(self.g_proj(x).astype(mx.float32)).astype(out.dtype)
        return self.dense((out * gate[..., None]).reshape(b, length, -1))


class ScaledQueryAttention(LatentAttention):
    """mistral4's MLA: its llama-4 position scale `attn_scale` multiplies both query parts."""

    def __call__(self, x, attn_scale, mask=None, cache=None):
        if not _on_pages(cache):
            return super(LatentAttention, self).__call__(x, attn_scale, mask=mask, cache=cache)
        q_nope, q_rope, latent, rope = latent_inputs(self, x, cache.offset)
        q_nope, q_rope = q_nope * attn_scale, q_rope * attn_scale
        out = latent_attention(q_nope, q_rope, latent, rope, cache, self)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1))


class SparseLatentAttention(LatentAttention):
    """DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa): MLA whose queries each attend to
    the keys its indexer picks; its cache is the latent pages and the indexer's key pages
    (`sparse_selection.py`)."""

    def __call__(self, x, mask=None, cache=None):
        if cache is None or not _on_pages(cache[0]):
            return super(LatentAttention, self).__call__(x, mask=mask, cache=cache)
        latent_cache, index_cache = cache[0], cache[1]
        qr = self.q_a_layernorm(self.q_a_proj(x))
        parts = latent_inputs(self, x, latent_cache.offset, qr)
        sparse = index_selection(self.indexer, x, qr, index_cache, latent_cache.offset)
        out = latent_attention(*parts, latent_cache, self, sparse)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(*x.shape[:2], -1))


class ExpandedLatentAttention(LatentAttention):
    """MLA that mlx-lm runs expanded, caching per-head keys and values (deepseek_v2,
    minicpm3, youtu_llm): on pages it caches the latent rows instead, with `embed_q` and
    `unembed_out` taken from its `kv_b_proj` (per head, the key rows then the value rows)."""

    def prepare_pages(self) -> None:
        heads, nope = self.num_heads, self.qk_nope_head_dim
        weight = _dense_weight(self.kv_b_proj)
        weight = weight.reshape(heads, -1, weight.shape[-1])  # (H, nope + V, R)
        rank = weight.shape[-1]
        self.embed_q = MultiLinear(nope, rank, heads)
        self.embed_q.weight = mx.contiguous(weight[:, :nope].swapaxes(1, 2))
        self.unembed_out = MultiLinear(rank, weight.shape[1] - nope, heads)
        self.unembed_out.weight = mx.contiguous(weight[:, nope:])
        if not hasattr(self, "scale"):  # minicpm3
            self.scale = self.softmax_scale
        mx.eval(self.embed_q.parameters(), self.unembed_out.parameters())


def _dense_weight(linear) -> mx.array:
    """A linear layer's weight `(out, in)`, dequantized where it is quantized."""
    if isinstance(linear, nn.QuantizedLinear):
        return mx.dequantize(linear.weight, linear.scales, linear.get("biases"),
                             linear.group_size, linear.bits, mode=linear.mode)  # fmt: skip
    return linear.weight


# Per mlx-lm MLA class, the stand-in its instances become on the paged path.
LATENT_ADAPTERS = {
    cls: type(f"Paged{cls.__name__}", (mixin, cls), {})
    for cls, mixin in (
        (deepseek_v3.DeepseekV3Attention, LatentAttention),
        (glm4_moe_lite.Glm4MoeLiteAttention, LatentAttention),
        (longcat_flash.LongcatFlashMLA, LatentAttention),
        (kimi_linear.KimiMLAAttention, LatentAttention),
        (mistral4.Mistral4Attention, ScaledQueryAttention),
        (bailing_hybrid.MultiLatentAttention, DenseOutput),
        (bailing_moe_v3.BailingMLA, GatedOutput),
        (deepseek_v32.DeepseekV32Attention, SparseLatentAttention),
        (deepseek_v2.DeepseekV2Attention, ExpandedLatentAttention),
        (minicpm3.Attention, ExpandedLatentAttention),
        (youtu_llm.YoutuLLMAttention, ExpandedLatentAttention),
    )
}
