"""bench/host_cost.py measures on a CUDA GPU only, and says so elsewhere."""

import mlx.core as mx
import pytest

from mlx_paged.bench.host_cost import main


def test_host_cost_needs_cuda_and_says_so(capsys):
    if mx.default_device().type == mx.DeviceType.gpu:
        pytest.skip("a GPU machine runs the measurement itself")
    assert main([]) == 2
    assert "needs MLX on a CUDA GPU" in capsys.readouterr().out
