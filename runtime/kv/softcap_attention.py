"""gemma2's attention on pages: mlx-lm's gemma2 computes its soft-capped scores by hand over the
K/V its cache returns, which paged caches do not gather. On the paged path its attention modules
become `SoftcapAttention`, which does the same projections and RoPE and hands the scores' cap to
paged attention inside the mask (`PagedMask.softcap`); the reference path computes them op for op
as mlx-lm does (`softcapped_attention`)."""

from __future__ import annotations

from mlx_lm.models import gemma2

from mlx_paged.kv.attention_hook import paged_scaled_dot_product_attention
from mlx_paged.kv.paged_cache import PagedMask


class SoftcapAttention(gemma2.Attention):
    """gemma2's attention, its scores attended through the attention hook."""

    def __call__(self, x, mask=None, cache=None):
        if cache is None:
            return super().__call__(x, mask, cache)
        b, length, _ = x.shape
        queries, keys, values = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        queries = queries.reshape(b, length, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = keys.reshape(b, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = values.reshape(b, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        queries = self.rope(queries, offset=cache.offset)
        keys = self.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        if isinstance(mask, PagedMask):  # else the load's probe, which only looks at shapes
            mask = PagedMask(mask.window, self.attn_logit_softcapping)
        out = paged_scaled_dot_product_attention(
            queries, keys, values, cache, scale=self.scale, mask=mask
        )
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


def adapt_softcap_attention(model) -> int:
    """Turn the model's gemma2 attention modules into `SoftcapAttention`s; returns how many."""
    adapted = 0
    for _, module in model.named_modules():
        if type(module) is gemma2.Attention:
            module.__class__ = SoftcapAttention
            adapted += 1
    return adapted
