"""Bucketed prefill attention (`PrefillShapes`): the buckets, and the same outputs as plain
causal SDPA over the unpadded rows."""

from __future__ import annotations

import threading

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.kv.prefill_shapes import PrefillShapes, bucket

H, KV, D = 4, 2, 16


def _rand(*shape, dtype=mx.float32):
    return mx.random.normal(shape, key=mx.random.key(sum(shape))).astype(dtype)


def _plain(q, k, v, scale):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask="causal")


def test_buckets_are_powers_of_two_from_64():
    assert [bucket(n) for n in (1, 63, 64, 65, 128, 129, 1000, 4096)] == [
        64, 64, 64, 128, 128, 256, 1024, 4096,
    ]  # fmt: skip


def test_shapes_cover_each_bucket_a_step_can_meet():
    shapes = PrefillShapes(H, KV, D, mx.float32).shapes(max_rows=3, max_width=100, max_len=200)
    own = [("own", b, w) for b in (1, 2, 4) for w in (64, 128)]
    # A row of q queries over up to 200 + q - 1 keys (its end padding included).
    rows = [("row", 64, k) for k in (64, 128, 256, 512)] + [
        ("row", 128, k) for k in (128, 256, 512)
    ]
    assert shapes == own + rows


def test_wide_heads_keep_row_shapes_as_they_are():
    shapes = PrefillShapes(H, KV, 128, mx.bfloat16)
    assert not shapes.rows_bucketed
    assert {kind for kind, _, _ in shapes.shapes(8, 2048, 8192)} == {"own"}


@pytest.mark.parametrize("rows,width", [(3, 100), (1, 64), (5, 7)])
def test_own_rows_match_plain_causal_attention(rows, width):
    q, k, v = _rand(rows, H, width, D), _rand(rows, KV, width, D), _rand(rows, KV, width, D)
    got = PrefillShapes(H, KV, D, mx.float32).attend_own(q, k, v, scale=D**-0.5)
    assert got.shape == (rows, H, width, D)
    np.testing.assert_allclose(got, _plain(q, k, v, D**-0.5), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("count,total", [(37, 300), (64, 64), (1, 129), (100, 100), (200, 1000)])
@pytest.mark.parametrize("dtype,tol", [(mx.float32, 1e-5), (mx.bfloat16, 2e-2)])
def test_a_row_over_its_context_matches_plain_causal_attention(count, total, dtype, tol):
    """Front padding (marked keys) and end padding leave the real queries' outputs alone."""
    q, k, v = (
        _rand(1, H, count, D, dtype=dtype),
        _rand(1, KV, total, D, dtype=dtype),
        _rand(1, KV, total, D, dtype=dtype),
    )
    scale = D**-0.5
    got = PrefillShapes(H, KV, D, dtype).attend_row(q, k, v, scale)
    want = _plain(q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32), scale)
    assert got.shape == (1, H, count, D) and got.dtype == dtype
    np.testing.assert_allclose(got.astype(mx.float32), want, rtol=tol, atol=tol)


def test_warm_up_runs_every_shape_once_per_thread():
    shapes = PrefillShapes(H, KV, D, mx.float32)
    ran = []
    shapes._run = lambda *shape: ran.append(shape)
    shapes.warm_up(max_rows=2, max_width=64, max_len=64)
    shapes.warm_up(max_rows=2, max_width=64, max_len=64)
    assert ran == shapes.shapes(2, 64, 64)
    other = threading.Thread(target=shapes.warm_up, args=(2, 64, 64))
    other.start()
    other.join()
    assert len(ran) == 2 * len(shapes.shapes(2, 64, 64))
