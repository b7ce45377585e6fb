"""A decode step of fewer graph nodes for llama-like models (`LEAN_FAMILIES`).

MLX spends host time on every node of a step's graph, whatever the node does, so a decode
step's speed is set by its node count (`mlx-paged bench ops`). mlx-lm's layer runs three
matmuls for q, k and v and two for gate and up, each with the flatten and unflatten MLX adds
around a matmul of `(B, 1, D)` activations, and transposes every head layout. `LeanDecode` runs
the same layer on `(B, D)` activations (one token a row): q, k and v from one matmul of weights
stacked at load (`fuse_projections`: the layer's own projections keep views of their rows, so
nothing is held twice; phi3 stacks them itself), one reshape and one split into heads, gate and
up from one matmul too.
Norms, RoPE, the page writes and attention are the module's own calls and the attention hook's,
so the step computes what mlx-lm's forward computes on pages. Every row of a decode forward is
one token, speculative verify rows and prefill chunk tokens riding along included, so those
forwards run this step too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.gemma3_text import clip_residual
from mlx_lm.models.ministral3 import _get_llama_4_attn_scale

from mlx_paged.kv.attention_hook import decode_rows_attention, paged_scaled_dot_product_attention
from mlx_paged.kv.paged_cache import PagedMask
from mlx_paged.models.fused_projections import fuse_projections
from mlx_paged.models.lean_fused import FUSED_FAMILIES, FusedDecode, fused_layer, rotated_heads
from mlx_paged.models.lean_latent import LATENT_FAMILIES, latent_attend

logger = logging.getLogger(__name__)

# mlx-lm model types whose layers `LeanDecode` runs (mistral loads as llama); gemma3 with its
# own residual order (`_gemma3_step`).
LEAN_FAMILIES = ("llama", "mistral", "ministral3", "qwen2", "qwen3", "phi3", "qwen2_moe",
                 "qwen3_moe", "mixtral", "gemma3_text")  # fmt: skip


@dataclass(frozen=True)
class LeanLayer:
    """One transformer block: `qkv` its stacked input projections (`FusedProjections`, or
    phi3's own), `attend(x, cache, window, scale)` its attention of normed `(B, D)` inputs
    through its output projection, `mlp(x)` its feed-forward (stacked gate and up where dense,
    the block's own MoE call else). For `FusedDecode`: `stacked_qkv(x)` the q/k/v output of
    `heads` (H, Hkv, D) side by side, `gate_up(x)` a dense SwiGLU's gate and up side by side
    (None otherwise); None where the block's attention is MLA."""

    block: object
    qkv: object
    attend: Callable
    mlp: Callable[[mx.array], mx.array]
    stacked_qkv: Callable | None = None
    heads: tuple[int, int, int] | None = None
    gate_up: Callable | None = None


class LeanDecode:
    """`decoder(tokens, caches)`: the hidden states `(B, D)` after the final norm, of one token
    a row (`tokens` `(B,)`) over paged `caches` (one a layer), with `windows[i]` the sliding
    window of layer i (None: full attention)."""

    def __init__(self, inner, layers: list[LeanLayer], windows: list[int | None], family: str):
        self.inner, self.layers, self.windows = inner, layers, windows
        gemma = family == "gemma3_text"
        self.step = _gemma3_step if gemma else _llama_step
        self.embed_scale = inner.args.hidden_size**0.5 if gemma else None
        # ministral3 scales its queries by position (llama 4's scaling).
        self.position_scaling = inner.args.rope_parameters if family == "ministral3" else None

    def __call__(self, tokens: mx.array, caches: list) -> mx.array:
        h = self.inner.embed_tokens(tokens)
        if self.embed_scale is not None:  # gemma3 scales its embeddings, rounded to bf16
            h = h * mx.array(self.embed_scale, mx.bfloat16).astype(h.dtype)
        scale = None
        if self.position_scaling is not None:
            rope = self.position_scaling
            scale = _get_llama_4_attn_scale(1, caches[0].offset, rope["llama_4_scaling_beta"],
                                            rope["original_max_position_embeddings"])  # fmt: skip
            scale = scale.astype(h.dtype)
        for layer, cache, window in zip(self.layers, caches, self.windows):
            h = self.step(layer, h, cache, window, scale)
        return self.inner.norm(h)


def _attention(attn, qkv, heads, x: mx.array, cache, window: int | None, scale) -> mx.array:
    """`attn`'s attention of normed `(B, D)` inputs, its queries, keys and values from `qkv` in
    `heads` (query heads, KV heads, head size), through its output projection; `scale`
    multiplies the RoPE'd queries where not None."""
    q, k, v = rotated_heads(attn, qkv(x), heads, cache.offset)
    k, v = cache.update_and_fetch(k, v)
    if scale is not None:
        q = q * scale
    rows = decode_rows_attention(q, cache, attn.scale, window)
    if rows is not None:
        return attn.o_proj(rows)
    out = paged_scaled_dot_product_attention(q, k, v, cache, scale=attn.scale,
                                             mask=PagedMask(window))  # fmt: skip
    return attn.o_proj(out.reshape(x.shape[0], -1))


def _llama_step(layer: LeanLayer, h: mx.array, cache, window: int | None, scale) -> mx.array:
    """One block on `(B, D)` hidden states, as mlx-lm's block computes it for one token."""
    block = layer.block
    h = h + layer.attend(block.input_layernorm(h), cache, window, scale)
    return h + layer.mlp(block.post_attention_layernorm(h))


def _gemma3_step(layer: LeanLayer, h: mx.array, cache, window: int | None, scale) -> mx.array:
    """gemma3's block: normed attention and MLP outputs, each added by `clip_residual`."""
    block = layer.block
    r = layer.attend(block.input_layernorm(h), cache, window, scale)
    h = clip_residual(h, block.post_attention_layernorm(r))
    r = layer.mlp(block.pre_feedforward_layernorm(h))
    return clip_residual(h, block.post_feedforward_layernorm(r))


def build_lean_decode(model, windows: list[int | None], mode: str = "on"):
    """The lean decode step of `model` where its family and layers allow, stacking its q, k, v
    and gate, up weights (the model's own calls then read views of them); else None, logged.
    `mode` "fused": its layers' small ops fused too (`FusedDecode`; raises where the model's
    blocks do not allow it); "auto": fused where they allow, else `LeanDecode`. Build it
    before `cache_weight_views`, so those views are of the stacked weights."""
    text = getattr(model, "language_model", model)  # a wrapper's text model (mistral3)
    family = getattr(text, "model_type", None) or getattr(getattr(text, "args", None),
                                                          "model_type", None)  # fmt: skip
    inner = getattr(text, "model", None)
    why = _refusal(family, inner, windows)
    if why is None:
        layers = [_lean_layer(block, family in LATENT_FAMILIES) for block in inner.layers]
        if any(layer is None for layer in layers):
            why = "its projections cannot be stacked (mixed kinds or quantization)"
    if why is None and mode != "on":
        fused = _fused_decode(family, inner, layers, windows)
        if isinstance(fused, FusedDecode):
            return fused
        if mode == "fused":
            raise ValueError(
                f"--lean-decode fused cannot serve this model: {fused}: use --lean-decode on"
            )
        logger.info("decode steps run the lean forward unfused: %s", fused)
    if why is not None and mode == "fused":
        raise ValueError(f"--lean-decode fused cannot serve this model: {why}")
    if why is not None:
        logger.info("decode steps run mlx-lm's forward: %s", why)
        return None
    logger.info("decode steps run the lean forward (%s, %d layers)", family, len(layers))
    return LeanDecode(inner, layers, windows, family)


def _fused_decode(family: str, inner, layers: list[LeanLayer], windows) -> FusedDecode | str:
    """`FusedDecode` of the lean `layers`, or why a block does not fuse."""
    if family not in FUSED_FAMILIES or type(inner.norm) is not nn.RMSNorm:
        return f"it covers {', '.join(FUSED_FAMILIES)} (pre-norm RMSNorm blocks), not {family}"
    fused = [fused_layer(layer) for layer in layers]
    why = next((f"layer {i}: {f}" for i, f in enumerate(fused) if isinstance(f, str)), None)
    if why is not None:
        return why
    logger.info("decode steps run the fused lean forward (%s, %d layers)", family, len(fused))
    return FusedDecode(inner, fused, windows)


def _refusal(family, inner, windows) -> str | None:
    if family not in LEAN_FAMILIES + LATENT_FAMILIES:
        covered = ", ".join(LEAN_FAMILIES + LATENT_FAMILIES)
        return f"the lean forward covers {covered}, not {family}"
    if inner is None or len(getattr(inner, "layers", ())) != len(windows):
        return "its layers are not one attention cache each"
    return None


def _lean_layer(block, latent: bool) -> LeanLayer | None:
    """`block`'s stacked projections (None, with nothing changed, where they do not stack);
    `latent`: its attention is MLA (`lean_latent.py`)."""
    attn = block.self_attn
    mlp = block.mlp if "mlp" in block else block.block_sparse_moe  # mixtral's name
    if latent:
        found = latent_attend(attn)
        return None if found is None else _with_mlp(block, found[1], found[0], mlp)
    num_heads = getattr(attn, "n_heads", None) or attn.num_heads  # mixtral's names
    num_kv_heads = getattr(attn, "n_kv_heads", None) or attn.num_key_value_heads
    if hasattr(attn, "qkv_proj"):  # phi3 keeps them stacked, gate and up too
        heads = (num_heads, num_kv_heads, attn.head_dim)
        attend = partial(_attention, attn, attn.qkv_proj, heads)
        return LeanLayer(block, attn.qkv_proj, attend, mlp, attn.qkv_proj, heads,
                         getattr(mlp, "gate_up_proj", None))  # fmt: skip
    qkv = fuse_projections([attn.q_proj, attn.k_proj, attn.v_proj])
    if qkv is None:
        return None
    heads = (num_heads, num_kv_heads, qkv.rows[0] // num_heads)
    layer = _with_mlp(block, qkv, partial(_attention, attn, qkv.fused, heads), mlp)
    return None if layer is None else replace(layer, stacked_qkv=qkv.fused, heads=heads)


def _with_mlp(block, qkv, attend, mlp) -> LeanLayer | None:
    """The layer with `mlp`: its own call for a mixture of experts, gate and up stacked for a
    dense one (None where they do not stack; the stacked attention projections stay, read as
    views by mlx-lm's own calls all the same)."""
    if not hasattr(mlp, "gate_proj"):
        return LeanLayer(block, qkv, attend, mlp)
    gate_up = fuse_projections([mlp.gate_proj, mlp.up_proj])
    if gate_up is None:
        return None
    gelu = "gemma3" in type(mlp).__module__
    return LeanLayer(block, qkv, attend, _dense_mlp(mlp, gate_up),
                     gate_up=None if gelu else gate_up.fused)  # fmt: skip


def _dense_mlp(mlp, gate_up) -> Callable[[mx.array], mx.array]:
    """`mlp`'s own computation, gate and up from the stacked matmul: SwiGLU, or gemma3's
    approximate GELU times up."""
    gelu = "gemma3" in type(mlp).__module__

    def call(x: mx.array) -> mx.array:
        gate, up = gate_up(x)
        return mlp.down_proj(nn.gelu_approx(gate) * up if gelu else swiglu(gate, up))

    return call
