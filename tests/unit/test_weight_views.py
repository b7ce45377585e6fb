"""Linear layers with a cached transposed weight view: same outputs, fewer graph nodes."""

import re

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlx_paged.models.weight_views import TransposedWeightLinear, cache_weight_views


def _node_kinds(array: mx.array, path) -> list[str]:
    mx.export_to_dot(str(path), array)
    return re.findall(r'label ="([A-Za-z]+)"', path.read_text())


def test_outputs_are_bit_identical_and_the_transpose_node_is_gone(tmp_path):
    mx.random.seed(0)
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 16, bias=False), nn.Embedding(8, 4))
    x = mx.random.normal((3, 1, 32))
    before = model.layers[1](model.layers[0](x))
    assert "Transpose" in _node_kinds(before, tmp_path / "before.dot")
    params_before = sorted(k for k, _ in tree_flatten(model.parameters()))
    assert cache_weight_views(model) == 2
    assert all(isinstance(m, TransposedWeightLinear) for m in model.layers[:2])
    after = model.layers[1](model.layers[0](x))
    assert mx.array_equal(before, after).item()
    assert "Transpose" not in _node_kinds(after, tmp_path / "after.dot")
    assert sorted(k for k, _ in tree_flatten(model.parameters())) == params_before
