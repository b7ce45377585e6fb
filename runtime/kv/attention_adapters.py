"""Paged stand-ins for mlx-lm attention code that paged caches cannot run as written.

- gemma2 computes its soft-capped scores by hand over the K/V its cache returns, which paged
  caches do not gather: `SoftcapAttention` hands the cap to paged attention in the mask
  (`PagedMask.softcap`), and the reference computes the scores op for op as mlx-lm does.
- llama4 builds its chunked-attention mask, and scales its NoPE layers' queries, from one
  integer cache offset; paged rows each have their own. `ChunkedLlamaModel` hands attention
  `PagedMask(chunk=...)` instead, and `ChunkedLlamaAttention` scales each row at its positions.

`adapt_attention` swaps the classes of a loaded model's modules on the paged path only.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models import gemma2, llama4

from mlx_paged.kv.attention_hook import paged_scaled_dot_product_attention
from mlx_paged.kv.paged_cache import PagedLayerCache, PagedMask


def _heads(attention, x):
    """Queries, keys and values of `x` `(B, L, D)` as `(B, heads, L, head dim)`, as mlx-lm's
    attention modules project them."""
    b, length, _ = x.shape
    split = [(attention.q_proj, attention.n_heads)] + [(p, attention.n_kv_heads)
             for p in (attention.k_proj, attention.v_proj)]  # fmt: skip
    return [proj(x).reshape(b, length, heads, -1).transpose(0, 2, 1, 3) for proj, heads in split]


class SoftcapAttention(gemma2.Attention):
    """gemma2's attention, its scores attended through the attention hook."""

    def __call__(self, x, mask=None, cache=None):
        if cache is None:
            return super().__call__(x, mask, cache)
        b, length, _ = x.shape
        queries, keys, values = _heads(self, x)
        queries = self.rope(queries, offset=cache.offset)
        keys = self.rope(keys, offset=cache.offset)
        keys, values = cache.update_and_fetch(keys, values)
        if isinstance(mask, PagedMask):  # else the load's probe, which only looks at shapes
            mask = PagedMask(mask.window, self.attn_logit_softcapping)
        out = paged_scaled_dot_product_attention(
            queries, keys, values, cache, scale=self.scale, mask=mask
        )
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class ChunkedLlamaModel(llama4.LlamaModel):
    """llama4's text model with every layer's mask a `PagedMask`: chunked on the layers
    mlx-lm gives chunked attention (3 of every 4), full on the others."""

    def __call__(self, inputs, cache=None):
        if cache is None or hasattr(cache[0], "maybe_trim_front"):  # mlx-lm's own caches
            return super().__call__(inputs, cache)
        paged = isinstance(cache[0], PagedLayerCache)  # else the load's probe: no mask
        h = self.embed_tokens(inputs)
        for idx, (layer, c) in enumerate(zip(self.layers, cache)):
            chunk = self.attention_chunk_size if (idx + 1) % 4 != 0 else None
            h = layer(h, PagedMask(chunk=chunk) if paged else None, cache=c)
        return self.norm(h)


class ChunkedLlamaAttention(llama4.Attention):
    """llama4's attention with its NoPE layers' query scale computed per row, at each row's
    own positions (mlx-lm's formula, which takes one offset for the batch)."""

    def __call__(self, x, mask=None, cache=None):
        offset = getattr(cache, "offset", 0)
        if not (self.attn_temperature_tuning and not self.use_rope) or isinstance(offset, int):
            return super().__call__(x, mask, cache)
        b, length, _ = x.shape
        queries, keys, values = _heads(self, x)
        positions = offset[:, None] + mx.arange(1, length + 1)
        scales = mx.log(mx.floor(positions / self.floor_scale) + 1.0) * self.attn_scale + 1.0
        queries = (queries * scales[:, None, :, None]).astype(queries.dtype)
        keys, values = cache.update_and_fetch(keys, values)
        out = paged_scaled_dot_product_attention(
            queries, keys, values, cache, scale=self.scale, mask=mask
        )
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


# Per mlx-lm class: its stand-in, and the score rule it hands attention (`ScoreRules`).
ADAPTERS = {
    gemma2.Attention: (SoftcapAttention, "softcap"),
    llama4.LlamaModel: (ChunkedLlamaModel, "chunked"),
    llama4.Attention: (ChunkedLlamaAttention, None),
}


@dataclass(frozen=True)
class ScoreRules:
    """What a model's attention computes besides plain masked scores: a cap on the scores
    (gemma2), or chunks some layers attend within (llama4). The SIMT decode kernels take both;
    the tensor-core and RoPE-fused ones compute plain scores."""

    softcap: bool = False
    chunked: bool = False

    @property
    def plain(self) -> bool:
        return not (self.softcap or self.chunked)

    def __str__(self) -> str:
        rules = [("soft-capped scores (gemma2)", self.softcap), ("chunks (llama4)", self.chunked)]
        return " and ".join(name for name, on in rules if on) or "plain scores"


def adapt_attention(model) -> ScoreRules:
    """Swap the model's modules listed in `ADAPTERS` (and its MLA modules) for their paged
    stand-ins; returns the score rules the adapted modules hand attention."""
    from mlx_paged.kv.latent_adapters import LATENT_ADAPTERS

    rules = set()
    for _, module in model.named_modules():
        adapter = ADAPTERS.get(type(module))
        if adapter is not None:
            module.__class__ = adapter[0]
            rules.add(adapter[1])
        elif type(module) in LATENT_ADAPTERS:  # MLA: latent pages (`latent_adapters.py`)
            module.__class__ = LATENT_ADAPTERS[type(module)]
            module.prepare_pages()
    return ScoreRules(softcap="softcap" in rules, chunked="chunked" in rules)


def serves_chunked_attention(model) -> bool:
    """Whether `adapt_attention` gave the model masks for its chunked-attention caches."""
    return any(isinstance(m, ChunkedLlamaModel) for _, m in model.named_modules())
