"""The benchmarks' problems: a shuffled page pool with block tables and queries, and the same
K/V made contiguous for the peers."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.kernel_inputs import input_array
from mlx_paged.kernels.paged_attention_reference import gather_pages


def make_problem(
    batch: int,
    context: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype,
    pool_bytes: int,
    seed: int = 0,
    sequential_blocks: bool = False,
    head_major_pages: bool = False,
):
    """Pool, shuffled (or, for comparison, consecutive) block tables and queries for `batch`
    rows of `context` tokens each. `head_major_pages` stores each page as `[Hkv, block, D]`
    (one KV head's page contiguous) and hands out the `[block, Hkv, D]` view of it, so the
    kernels read the same logical pages through other strides."""
    per_row = math.ceil(context / block_size)
    block_bytes = 2 * block_size * num_kv_heads * head_dim * dtype.size
    num_blocks = max(batch * per_row + 1, pool_bytes // block_bytes)
    rng = np.random.default_rng(seed)
    ids = (
        np.arange(1, num_blocks) if sequential_blocks else rng.permutation(np.arange(1, num_blocks))
    )
    ids = ids[: batch * per_row]
    tables = input_array(ids.reshape(batch, per_row))
    mx.random.seed(seed)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_pages = mx.random.normal(shape).astype(dtype)
    v_pages = mx.random.normal(shape).astype(dtype)
    if head_major_pages:
        k_pages, v_pages = head_major_view(k_pages), head_major_view(v_pages)
    queries = mx.random.normal((batch, num_heads, 1, head_dim)).astype(dtype)
    lens = input_array([context] * batch)
    mx.eval(k_pages, v_pages, queries, tables, lens)
    return queries, k_pages, v_pages, tables, lens


def head_major_view(pages: mx.array) -> mx.array:
    """`pages` (`[blocks, block, Hkv, ...]`) stored KV-head-major (`[blocks, Hkv, block, ...]`,
    one head's page contiguous) and handed out as their token-major view: the same values
    through other strides."""
    return mx.contiguous(pages.swapaxes(1, 2)).swapaxes(1, 2)


def standard_problem(batch: int, context: int, pool_bytes: int = 4 << 30):
    """`make_problem` at the kernel benchmark's shape: 32 query / 8 KV heads, head_dim 128,
    bf16, blocks of 16 (the diagnostics use it)."""
    return make_problem(
        batch,
        context,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        block_size=16,
        dtype=mx.bfloat16,
        pool_bytes=pool_bytes,
    )


def contiguous_kv(
    k_pages: mx.array, v_pages: mx.array, tables: mx.array, context: int
) -> tuple[mx.array, mx.array]:
    """The same K/V as dense `(B, Hkv, context, D)` arrays, for the contiguous peers."""
    k = mx.contiguous(gather_pages(k_pages, tables)[:, :, :context])
    v = mx.contiguous(gather_pages(v_pages, tables)[:, :, :context])
    mx.eval(k, v)
    return k, v
