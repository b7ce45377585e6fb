"""GPU tests run only where MLX has its CUDA (or Metal) backend."""

import mlx.core as mx
import pytest


def _gpu_backend():
    from mlx_paged.kernels.paged_attention import current_backend

    return current_backend()


def pytest_collection_modifyitems(config, items):
    if _gpu_backend() is not None:
        return
    skip = pytest.mark.skip(
        reason=f"needs MLX on a GPU (CUDA or Metal); this machine runs MLX on {mx.default_device()}"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
