"""The recurrence hook reroutes nothing outside a paged forward with a recurrence backend: a
hybrid loaded on the CPU keeps mlx-lm's recurrence loop, and mlx-lm's own calls stay its own."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm.models.gated_delta as mlx_gated_delta
import mlx_lm.models.qwen3_5 as mlx_qwen3_5
from tiny_models import build_model

from mlx_paged import LLM
from mlx_paged.kv import recurrence_hook


def test_hybrid_on_the_cpu_keeps_mlx_lms_recurrence(tmp_path):
    llm = LLM(str(build_model(tmp_path / "q", "qwen3_5")), block_size=16, num_blocks=32)
    assert mlx_gated_delta.gated_delta_ops is recurrence_hook.gated_delta_ops
    assert mlx_qwen3_5.GatedDeltaNet.__call__ is recurrence_hook.gated_delta_layer
    assert not recurrence_hook.install_recurrence_hook()  # installed once
    assert llm.engine.runner.pool.recurrence_backend is None
    llm.generate([[5, 6, 7, 8]])
    assert not any(
        path.startswith("gated_delta") for path, _ in llm.engine.runner.pool.attention_calls
    )

    keys = mx.random.split(mx.random.key(0), 5)
    q, k = (mx.random.normal((1, 3, 2, 32), key=keys[i]) for i in range(2))
    v = mx.random.normal((1, 3, 4, 16), key=keys[2])
    g = mx.sigmoid(mx.random.normal((1, 3, 4), key=keys[3]))
    beta = mx.sigmoid(mx.random.normal((1, 3, 4), key=keys[4]))
    state = mx.zeros((1, 4, 16, 32))
    got = recurrence_hook.gated_delta_ops(q, k, v, g, beta, state)
    want = recurrence_hook._original(q, k, v, g, beta, state)
    assert all(mx.array_equal(a, b).item() for a, b in zip(got, want))
