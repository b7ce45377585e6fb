"""`fuse_projections`: one matmul gives every projection's output, and each projection keeps
computing what it did, from views of the stacked weight."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest

from mlx_paged.models.fused_projections import fuse_projections


def outputs(projections, x):
    return [p(x) for p in projections]


@pytest.mark.parametrize("bias", [False, True])
def test_linear_projections_fused(bias):
    mx.random.seed(0)
    projections = [nn.Linear(64, n, bias=bias) for n in (96, 32, 8, 8)]
    x = mx.random.normal((5, 1, 64))
    before = outputs(projections, x)
    fused = fuse_projections(projections)
    assert fused is not None
    for got, want in zip(fused(x), before):
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-5).item()
    for got, want in zip(outputs(projections, x), before):  # the views read the same values
        assert mx.array_equal(got, want).item()


def test_quantized_projections_fused():
    mx.random.seed(1)
    projections = [nn.QuantizedLinear(128, n, bias=False, group_size=64, bits=4) for n in (64, 32)]
    x = mx.random.normal((3, 1, 128))
    before = outputs(projections, x)
    fused = fuse_projections(projections)
    assert fused is not None
    for got, want in zip(fused(x), before):
        assert mx.allclose(got, want, atol=1e-4).item()
    for got, want in zip(outputs(projections, x), before):
        assert mx.array_equal(got, want).item()


@pytest.mark.parametrize(
    "projections",
    [
        lambda: [nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=True)],
        lambda: [nn.Linear(64, 32), nn.Linear(48, 32)],
        lambda: [nn.Linear(64, 64), nn.QuantizedLinear(64, 64, group_size=64, bits=4)],
        lambda: [nn.QuantizedLinear(64, 64, bits=4), nn.QuantizedLinear(64, 64, bits=8)],
    ],
    ids=["bias", "input_size", "kinds", "bits"],
)
def test_projections_that_differ_are_left_alone(projections):
    projections = projections()
    weights = [p.weight for p in projections]
    assert fuse_projections(projections) is None
    assert all(p.weight is w for p, w in zip(projections, weights))
