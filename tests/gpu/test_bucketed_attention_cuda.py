"""Bucketed prefill attention on the GPU (cuDNN's SDPA on CUDA): padded and marked rows give
what plain causal SDPA gives over the rows as they are."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.kv.prefill_shapes import PrefillShapes

pytestmark = pytest.mark.gpu

H, KV = 32, 8


def _rand(shape, seed):
    return mx.random.normal(shape, key=mx.random.key(seed)).astype(mx.bfloat16)


def _plain(q, k, v, scale):
    q, k, v = (x.astype(mx.float32) for x in (q, k, v))
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


@pytest.mark.parametrize("head_dim", [64, 96])
@pytest.mark.parametrize("count,total", [(448, 8640), (37, 300), (512, 512), (100, 4097)])
def test_a_row_over_its_context_matches_plain_attention(head_dim, count, total):
    q = _rand((1, H, count, head_dim), 1)
    k, v = _rand((1, KV, total, head_dim), 2), _rand((1, KV, total, head_dim), 3)
    scale = head_dim**-0.5
    got = PrefillShapes(H, KV, head_dim, mx.bfloat16).attend_row(q, k, v, scale)
    np.testing.assert_allclose(got.astype(mx.float32), _plain(q, k, v, scale), atol=2e-2)


@pytest.mark.parametrize("rows,width", [(3, 448), (8, 2048), (5, 64)])
def test_rows_from_zero_match_plain_attention(rows, width):
    q = _rand((rows, H, width, 64), 4)
    k, v = _rand((rows, KV, width, 64), 5), _rand((rows, KV, width, 64), 6)
    got = PrefillShapes(H, KV, 64, mx.bfloat16).attend_own(q, k, v, 0.125)
    np.testing.assert_allclose(got.astype(mx.float32), _plain(q, k, v, 0.125), atol=2e-2)
