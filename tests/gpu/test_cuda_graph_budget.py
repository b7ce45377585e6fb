"""Importing mlx_paged lifts MLX's CUDA graph input budget (`cuda_graphs`)."""

import os
import subprocess
import sys

import mlx.core as mx
import pytest

from mlx_paged.cuda_graphs import INPUT_BUDGET_ENV, LIFTED_INPUT_BUDGET


@pytest.mark.gpu
@pytest.mark.skipif(not (hasattr(mx, "cuda") and mx.cuda.is_available()), reason="needs CUDA")
def test_importing_lifts_the_budget_on_cuda():
    env = {k: v for k, v in os.environ.items() if k != INPUT_BUDGET_ENV}
    code = f"import os, mlx_paged; print(os.environ.get({INPUT_BUDGET_ENV!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == str(LIFTED_INPUT_BUDGET)
