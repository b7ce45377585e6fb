"""The generated decode-step kernel of a Qwen3.5 Gated DeltaNet layer computes what mlx-lm's own
layer computes (conv, norms, gates, recurrence), through the real layer: output, recurrent
state and conv state, for each sampled shape and dtype."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx.utils import tree_map
from mlx_lm.models.cache import ArraysCache
from mlx_lm.models.qwen3_5 import GatedDeltaNet, TextModelArgs

from mlx_paged.kernels.gated_delta import gated_delta_step_specs
from mlx_paged.kernels.paged_attention import current_backend
from mlx_paged.kv.attention_hook import forward_on
from mlx_paged.kv.paged_cache import PagedKVPool
from mlx_paged.kv.recurrence_hook import (
    _original_layer_call,
    fuse_input_projections,
    gated_delta_layer,
)

pytestmark = pytest.mark.gpu

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def _layer(spec) -> GatedDeltaNet:
    args = TextModelArgs(
        model_type="qwen3_5", hidden_size=256, num_hidden_layers=1, intermediate_size=512,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
        linear_num_key_heads=spec.key_heads, linear_num_value_heads=spec.value_heads,
        linear_key_head_dim=spec.key_dim, linear_value_head_dim=spec.value_dim,
        linear_conv_kernel_dim=spec.conv_size,
    )  # fmt: skip
    layer = GatedDeltaNet(args)
    dtype = _DTYPES[spec.dtype]
    layer.update(tree_map(lambda p: p.astype(dtype), layer.parameters()))
    return layer


def _cache(layer, spec, batch: int, seed: int) -> ArraysCache:
    keys = mx.random.split(mx.random.key(seed), 2)
    cache = ArraysCache(2)
    cache[0] = mx.random.normal((batch, spec.conv_size - 1, layer.conv_dim), key=keys[0])
    cache[0] = cache[0].astype(_DTYPES[spec.dtype])
    state = (batch, spec.value_heads, spec.value_dim, spec.key_dim)
    cache[1] = mx.random.normal(state, key=keys[1]) * 0.1
    return cache


@pytest.mark.parametrize("fused", [False, True], ids=["four_projections", "fused_projections"])
@pytest.mark.parametrize("spec", gated_delta_step_specs("cuda"), ids=lambda s: s.name)
def test_step_kernel_equals_mlx_lm_layer(spec, fused):
    """With `fused`, the kernel reads q, k, v, b and a from one matmul's output, through its
    strides, and mlx-lm's call reads the projections' views of the stacked weight."""
    backend = current_backend()
    if backend is None:
        pytest.skip("needs MLX's Metal or CUDA backend")
    layer, batch = _layer(spec), 5
    x = mx.random.normal((batch, 1, 256), key=mx.random.key(7)).astype(_DTYPES[spec.dtype])
    want_cache, got_cache = _cache(layer, spec, batch, 1), _cache(layer, spec, batch, 1)
    want = _original_layer_call(layer, x, None, want_cache)
    if fused:
        assert fuse_input_projections(layer) == 1
    pool = PagedKVPool(1, 4, 16, 2, 64)
    pool.recurrence_backend = backend
    with forward_on(pool):
        got = gated_delta_layer(layer, x, None, got_cache)
    assert pool.attention_calls["gated_delta_step_kernel", "decode"] == 1
    assert got.shape == want.shape and got.dtype == want.dtype
    # The conv state is moved, not computed: exact. The rest differs in fp32 summation order,
    # and so at times in an intermediate's rounding to the layer's dtype; the decay
    # exp(-A softplus(a + dt_bias)) turns a one-ulp softplus into A softplus ulps (bf16: ~1%).
    assert mx.array_equal(got_cache[0], want_cache[0]).item()
    tol = {"float32": 1e-4, "float16": 3e-3, "bfloat16": 3e-2}[spec.dtype]
    scale = max(float(mx.abs(want.astype(mx.float32)).max()), 1.0)
    assert float(mx.abs((got - want).astype(mx.float32)).max()) <= tol * scale
    state_scale = max(float(mx.abs(want_cache[1]).max()), 1.0)
    assert float(mx.abs(got_cache[1] - want_cache[1]).max()) <= tol * state_scale
    assert got_cache[1].dtype == mx.float32
