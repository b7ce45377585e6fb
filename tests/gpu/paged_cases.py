"""Random paged-attention problems: ragged lengths, part-filled last blocks, shuffled block ids."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from mlx_paged.kernels.paged_attention_reference import paged_attention_reference

TOLERANCE = {mx.float32: 1e-5, mx.bfloat16: 2e-2, mx.float16: 5e-3}


def make_case(
    seed: int,
    lens: list[int],
    *,
    num_kv_heads: int,
    gqa: int,
    head_dim: int,
    block_size: int,
    dtype,
    spare_blocks: int = 7,
    value_dim: int | None = None,
):
    """Pages, tables and queries for rows of lengths `lens`; block 0 is the null block; V
    pages of `value_dim` (default: `head_dim`)."""
    rng = np.random.default_rng(seed)
    needed = [math.ceil(n / block_size) for n in lens]
    num_blocks = 1 + sum(needed) + spare_blocks
    ids = rng.permutation(np.arange(1, num_blocks))
    width = max(needed)
    tables = np.zeros((len(lens), width), np.int32)
    at = 0
    for row, n in enumerate(needed):
        tables[row, :n] = ids[at : at + n]
        at += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_pages = mx.array(rng.standard_normal(shape, np.float32)).astype(dtype)
    v_shape = (*shape[:3], value_dim or head_dim)
    v_pages = mx.array(rng.standard_normal(v_shape, np.float32)).astype(dtype)
    queries = mx.array(
        rng.standard_normal((len(lens), num_kv_heads * gqa, 1, head_dim), np.float32)
    ).astype(dtype)
    return queries, k_pages, v_pages, mx.array(tables), mx.array(np.array(lens, np.int32))


def reference(queries, k_pages, v_pages, tables, lens, scale, window=None, **rules):
    """The oracle, in float32 on the CPU (GPU matmuls may use TF32); `rules`: `chunk` and
    `softcap` as `paged_attention_reference` takes them."""
    with mx.stream(mx.cpu):
        out = paged_attention_reference(
            queries.astype(mx.float32),
            k_pages.astype(mx.float32),
            v_pages.astype(mx.float32),
            tables,
            lens,
            (lens - 1)[:, None],
            scale=scale,
            window=window,
            **rules,
        )
        mx.eval(out)
    return out


def max_error(out, ref) -> float:
    with mx.stream(mx.cpu):
        return mx.max(mx.abs(out.astype(mx.float32) - ref)).item()
