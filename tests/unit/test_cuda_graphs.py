"""The CUDA graph input budget that importing mlx_paged lifts (`cuda_graphs`)."""

import os
import subprocess
import sys

import mlx.core as mx
import pytest

from mlx_paged.cuda_graphs import INPUT_BUDGET_ENV, lift_graph_input_budget

ON_CUDA = hasattr(mx, "cuda") and mx.cuda.is_available()


def _budget_after_import(env: dict) -> str | None:
    """MLX_MAX_MB_PER_BUFFER as a fresh process sees it after `import mlx_paged`."""
    code = f"import os, mlx_paged; print(os.environ.get({INPUT_BUDGET_ENV!r}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)  # fmt: skip
    value = out.stdout.strip()
    return None if value == "None" else value


def test_a_budget_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv(INPUT_BUDGET_ENV, "123")
    assert lift_graph_input_budget() is False
    assert os.environ[INPUT_BUDGET_ENV] == "123"
    env = {**os.environ, INPUT_BUDGET_ENV: "123"}
    assert _budget_after_import(env) == "123"


@pytest.mark.skipif(ON_CUDA, reason="MLX runs on CUDA here: the budget is lifted")
def test_other_backends_keep_mlx_budget(monkeypatch):
    monkeypatch.delenv(INPUT_BUDGET_ENV, raising=False)
    assert lift_graph_input_budget() is False
    assert INPUT_BUDGET_ENV not in os.environ
    env = {k: v for k, v in os.environ.items() if k != INPUT_BUDGET_ENV}
    assert _budget_after_import(env) is None
