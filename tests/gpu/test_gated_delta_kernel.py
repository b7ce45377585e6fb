"""The generated Gated DeltaNet kernel on the GPU computes what mlx-lm's ops loop computes:
outputs and final state, for every sampled shape and dtype, over one step (decode) and many
(prefill), from a non-contiguous value slice as the model's split hands it."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.gated_delta import compute_g

from mlx_paged.kernels.gated_delta import gated_delta, gated_delta_specs, spec_for
from mlx_paged.kernels.paged_attention import current_backend
from mlx_paged.kv.recurrence_hook import _original as mlx_lm_gated_delta_ops

pytestmark = pytest.mark.gpu

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def _inputs(spec, batch: int, steps: int, seed: int):
    """Inputs as a Qwen3.5 layer makes them: unit-norm q and k (q scaled), v sliced out of a
    wider projection, g from mlx-lm's own gate, beta a sigmoid, a nonzero state."""
    keys = iter(mx.random.split(mx.random.key(seed), 6))
    dtype = _DTYPES[spec.dtype]

    def unit(shape):
        x = mx.random.normal(shape, key=next(keys))
        return x / mx.linalg.norm(x, axis=-1, keepdims=True)

    qk = (batch, steps, spec.key_heads, spec.key_dim)
    q = (unit(qk) * spec.key_dim**-0.5).astype(dtype)
    k = unit(qk).astype(dtype)
    wide = mx.random.normal((batch, steps, spec.value_heads, 2 * spec.value_dim), key=next(keys))
    v = wide.astype(dtype)[..., : spec.value_dim]  # a strided view, not a copy
    a = mx.random.normal((batch, steps, spec.value_heads), key=next(keys)).astype(dtype)
    g = compute_g(mx.zeros((spec.value_heads,)), a, mx.ones((spec.value_heads,)))
    beta = mx.sigmoid(mx.random.normal((batch, steps, spec.value_heads), key=next(keys)))
    state_shape = (batch, spec.value_heads, spec.value_dim, spec.key_dim)
    state = mx.random.normal(state_shape, key=next(keys)) * 0.1
    return q, k, v, g, beta.astype(dtype), state


@pytest.mark.parametrize("steps", [1, 37])
@pytest.mark.parametrize("spec", gated_delta_specs("cuda"), ids=lambda s: s.name)
def test_kernel_equals_mlx_lm_ops(spec, steps):
    backend = current_backend()
    if backend is None:
        pytest.skip("needs MLX's Metal or CUDA backend")
    q, k, v, g, beta, state = _inputs(spec, batch=3, steps=steps, seed=steps)
    spec = spec_for(backend, q, v)
    y, new_state = gated_delta(spec, q, k, v, g, beta, state)
    want_y, want_state = mlx_lm_gated_delta_ops(q, k, v, g, beta, state)
    assert y.shape == want_y.shape and y.dtype == want_y.dtype
    assert new_state.shape == want_state.shape and new_state.dtype == mx.float32
    # Both accumulate in fp32 and differ only in summation order; y is rounded to its dtype.
    tol = 1e-4 if spec.dtype == "float32" else 2e-2
    scale = float(mx.abs(want_y.astype(mx.float32)).max())
    y_err = float(mx.abs(y.astype(mx.float32) - want_y.astype(mx.float32)).max())
    state_err = float(mx.abs(new_state - want_state).max())
    assert y_err <= tol * max(scale, 1.0), (y_err, scale)
    assert state_err <= 1e-4 * max(float(mx.abs(want_state).max()), 1.0), state_err
    assert np.isfinite(np.array(y.astype(mx.float32))).all()
