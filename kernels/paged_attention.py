"""Launcher of the paged decode-attention kernels (`paged_attention.jinja`, pass 1 or the only
pass; `paged_attention_reduce.jinja`, pass 2). Rendering is in `paged_attention_geometry`, the
routing in `paged_attention_routing`; the oracle is `paged_attention_reference`."""

from __future__ import annotations

import functools
import math
import time
from typing import Optional

import mlx.core as mx

from mlx_paged.codegen.build import build
from mlx_paged.codegen.build import define as define_cached
from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.counter_chain import CounterChain
from mlx_paged.kernels.paged_attention_routing import (decode_specs, grid_partitions,
                                                       routed_partition_size, routed_specs,
                                                       routed_variant, use_single_pass)

# Every fused call counts its partitions on counters the previous call zeroed.
_COUNTERS = CounterChain()


def current_backend() -> Optional[str]:
    """"metal" or "cuda" when MLX's default device is a GPU with that backend, else None."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return None
    if mx.metal.is_available():
        return "metal"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return None


def paged_attention_decode(queries: mx.array, k_pages: mx.array, v_pages: mx.array,
                           block_tables: mx.array, seq_lens: mx.array, *, scale: float,
                           window: Optional[int] = None, sinks: Optional[mx.array] = None,
                           backend: Optional[str] = None,
                           partition_size: Optional[int] = None,
                           single_pass: Optional[bool] = None,
                           variant: Optional[str] = None) -> mx.array:
    """Decode attention of `(B, Hq, 1, D)` queries over paged K/V, on the GPU kernels.

    Each row's one query sits at position `seq_lens[b] - 1` and sees keys `[0, seq_lens[b])`
    (the last `window` of them with a sliding window). Pages are `[num_blocks, block_size,
    Hkv, D]`, row-contiguous; `block_tables` is `(B, max_blocks)` int32.

    Args:
        single_pass: force one variant (benchmarks); None applies `use_single_pass`.
        partition_size, variant: tuning for kernel authors (benchmarks); `variant` is a
            KernelSpec tuning suffix such as "s2_w8" ("" the FMA loop). None picks the
            routed ones (`routed_variant`, `routed_partition_size`).

    Raises:
        UnsupportedSpecError: for an input the kernels cannot serve (the message names the spec).
    """
    backend = backend or current_backend()
    num_seqs, num_heads, num_queries, head_dim = queries.shape
    _, block_size, num_kv_heads, page_dim = k_pages.shape
    if backend is None:
        raise UnsupportedSpecError("paged decode kernels need MLX's Metal or CUDA backend; "
                                   "the CPU runs paged_attention_reference")
    if num_heads % num_kv_heads:
        raise UnsupportedSpecError(f"{num_heads} query heads are not a multiple of "
                                   f"{num_kv_heads} KV heads")
    table_tokens = block_tables.shape[1] * block_size
    if variant is None:
        variant = routed_variant(backend, k_pages.dtype, head_dim, block_size, table_tokens)
    if partition_size is None:
        partition_size = routed_partition_size(variant, table_tokens)
    single, part1, part2 = decode_specs(backend, k_pages.dtype, head_dim, block_size,
                                        num_heads // num_kv_heads, window is not None,
                                        partition_size, variant)
    if num_queries != 1:
        raise UnsupportedSpecError(f"{single.name}: decode kernels take one query per row, "
                                   f"not {num_queries}")
    if sinks is not None:
        raise UnsupportedSpecError(f"{single.name}: attention sinks are not implemented")
    if page_dim != head_dim or v_pages.shape != k_pages.shape or queries.dtype != k_pages.dtype:
        raise UnsupportedSpecError(f"{single.name}: queries {queries.shape} {queries.dtype} do "
                                   f"not match pages {k_pages.shape} {k_pages.dtype}")
    if block_tables.dtype != mx.int32:
        block_tables = block_tables.astype(mx.int32)
    if seq_lens.dtype != mx.int32:
        seq_lens = seq_lens.astype(mx.int32)
    inputs = [queries, k_pages, v_pages, block_tables, seq_lens,
              _constant(float(scale), mx.float32)]
    if window is not None:
        inputs.append(_constant(int(window), mx.int32))
    template = [("T", k_pages.dtype)]
    num_partitions = math.ceil(block_tables.shape[1] * block_size / partition_size)
    if part1.grid_partitions:
        num_partitions = grid_partitions(num_seqs * num_kv_heads, num_partitions)
    if single_pass is None:
        single_pass = use_single_pass(num_seqs, num_kv_heads, num_partitions)
    if single_pass:
        tg, grid_x = _threads(single, num_kv_heads)
        return build(single)(
            inputs=inputs, template=template, grid=(grid_x, num_seqs, 1),
            threadgroup=(tg, 1, 1), output_shapes=[queries.shape],
            output_dtypes=[queries.dtype])[0]
    tg, grid_x = _threads(part1, num_kv_heads)
    partial_shapes = [(num_seqs, num_heads, num_partitions, head_dim),
                      (num_seqs, num_heads, num_partitions), (num_seqs, num_heads, num_partitions)]
    if part1.fused_reduce:
        def launch(counters):
            return build(part1)(
                inputs=inputs + [counters], template=template,
                grid=(grid_x, num_seqs, num_partitions), threadgroup=(tg, 1, 1),
                output_shapes=[queries.shape] + partial_shapes + [counters.shape],
                output_dtypes=[queries.dtype] + [mx.float32] * 3 + [mx.int32])
        return _COUNTERS.call(num_seqs * num_kv_heads, launch)[0]
    partial_out, partial_max, partial_sum = build(part1)(
        inputs=inputs, template=template,
        grid=(grid_x, num_seqs, num_partitions), threadgroup=(tg, 1, 1),
        output_shapes=partial_shapes, output_dtypes=[mx.float32] * 3)
    reduce_inputs = [partial_out, partial_max, partial_sum, seq_lens] + inputs[6:]  # + window
    return build(part2)(
        inputs=reduce_inputs, template=template, grid=(num_heads * 32, num_seqs, 1),
        threadgroup=(32, 1, 1), output_shapes=[queries.shape],
        output_dtypes=[queries.dtype])[0]


@functools.lru_cache(maxsize=64)
def _constant(value, dtype) -> mx.array:
    """A shape-(1,) scalar input, made once per value: a fresh array every call would cost a
    host-to-device transfer per layer per step."""
    array = mx.array([value], dtype=dtype)
    mx.eval(array)
    return array


def _threads(spec: KernelSpec, num_kv_heads: int) -> tuple[int, int]:
    """(threads per threadgroup, threads along the grid's x axis) of a pass-1 launch."""
    threads = define_cached(spec).threads_per_threadgroup
    return threads, threads * num_kv_heads


def warm_up(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int, gqa: int,
            sliding_window: bool, progress=None) -> list[KernelSpec]:
    """Compile every kernel a model's decode will call (`routed_specs`), one tiny call each.

    NVRTC/Metal compile a spec on its first call (about 2 s each on CUDA); doing it at load keeps
    that out of the first requests. `progress(spec, seconds)` reports each one.
    """
    specs = routed_specs(backend, dtype, head_dim, block_size, gqa, sliding_window)
    window = 4 if sliding_window else None
    pages = mx.zeros((17, block_size, 1, head_dim), dtype=dtype)
    for first in (s for s in specs if s.op == "paged_decode"):
        # A reduce pass compiles with the pass 1 of its partition size.
        group = [s for s in specs if s == first or (s.op == "paged_decode_reduce"
                                                    and s.partition_size == first.partition_size)]
        single_pass, partition_size = not first.partitioned, first.partition_size or None
        variant = first.tuning_suffix
        tic = time.perf_counter()
        # Batch 1 and batch 8: Metal keeps inputs under 8 elements in constant memory, which is
        # a separate compile; CUDA reuses the first build.
        for batch in (1, 8):
            queries = mx.zeros((batch, gqa, 1, head_dim), dtype=dtype)
            tables = mx.array([[2 * b + 1, 2 * b + 2] for b in range(batch)], dtype=mx.int32)
            lens = mx.full((batch,), block_size + 1, dtype=mx.int32)
            mx.eval(paged_attention_decode(queries, pages, pages, tables, lens, scale=1.0,
                                           window=window, backend=backend,
                                           single_pass=single_pass, variant=variant,
                                           partition_size=partition_size))
        if progress is not None:
            for spec in group:
                progress(spec, (time.perf_counter() - tic) / len(group))
    return specs
