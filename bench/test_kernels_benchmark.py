"""The kernel benchmark as a pytest-benchmark suite (not part of `make test`):

    .venv/bin/python -m pytest bench/test_kernels_benchmark.py --benchmark-columns=median,iqr

Same problems as `mlx-paged bench kernels` (shuffled pages in a pool larger than the GPU's
cache); the paged kernel runs only on a Metal/CUDA GPU, its peers also on the CPU.
"""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_paged.bench.problems import contiguous_kv, standard_problem
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode
from mlx_paged.kernels.paged_attention_reference import paged_attention_reference

ON_GPU = current_backend() is not None
SHAPES = [(1, 2048), (8, 8192), (64, 2048)] if ON_GPU else [(1, 512), (4, 512)]


@pytest.fixture(scope="module", params=SHAPES, ids=lambda s: f"B{s[0]}-T{s[1]}")
def problem(request):
    batch, context = request.param
    q, k_pages, v_pages, tables, lens = standard_problem(
        batch, context, pool_bytes=(1 << 30) if ON_GPU else (64 << 20)
    )
    k, v = contiguous_kv(k_pages, v_pages, tables, context)
    return q, k_pages, v_pages, tables, lens, k, v


def _run(benchmark, fn):
    benchmark(lambda: mx.eval(fn()))


@pytest.mark.skipif(not ON_GPU, reason="the paged kernel needs MLX on a Metal or CUDA GPU")
def test_paged_kernel(benchmark, problem):
    q, k_pages, v_pages, tables, lens, _, _ = problem
    _run(
        benchmark,
        lambda: paged_attention_decode(q, k_pages, v_pages, tables, lens, scale=128**-0.5),
    )


def test_mlx_sdpa_contiguous(benchmark, problem):
    q, *_, k, v = problem
    _run(benchmark, lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=128**-0.5))


def test_gather_then_sdpa(benchmark, problem):
    q, k_pages, v_pages, tables, lens, _, _ = problem
    _run(
        benchmark,
        lambda: paged_attention_reference(
            q, k_pages, v_pages, tables, lens, (lens - 1)[:, None], scale=128**-0.5
        ),
    )
