"""The launch plan of one decode-attention shape: which kernels, grids and output shapes.

Working these out takes several cached lookups keyed on `KernelSpec`s, and the launcher runs
once per layer per decode step, while the GPU kernel takes tens of microseconds at small
batches. So the whole plan is cached per shape, a call costs one
lookup, and the plan's kernel calls run under `mx.compile` (`LaunchPlan.launch`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from mlx_paged.kernels.kernel_spec import KERNELS, KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_geometry import build, define
from mlx_paged.kernels.paged_attention_routing import dtype_name, partition_size_for, route


@dataclass(frozen=True)
class LaunchPlan:
    """What one call of a shape launches: pass 1 (or the single pass) and, for the two-pass
    split-K, the reduce. `partial_shapes` are pass 1's fp32 outputs (none for the single pass,
    one flat array for the fused split-K); a `fused` pass 1 also takes and returns the counters
    (`CounterChain`).

    `launch(queries, k_pages, v_pages, block_tables, seq_lens, scale[, window or chunk][,
    softcap][, k_new, v_new, rope_inv_freq][, k_scales, k_biases][, v_scales, v_biases][,
    counters])` adds the plan's kernels to MLX's graph and returns a list: the output, then the
    rotated key of a `rope` plan, then a fused plan's next counters. It is `launch_eager` under
    `mx.compile`: traced once, each later call replays the kernel nodes without rebuilding them (see
    `_launch_function`).
    """

    name: str  # the pass-1 spec's name, for error messages
    kernel: Any
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    partial_shapes: tuple[tuple[int, ...], ...]
    fused: bool
    groups: int  # (sequence, KV head) pairs
    out_shape: tuple[int, ...]
    dtype: mx.Dtype
    counter_slots: int = 0  # the counters a fused call needs: one per group
    window: bool = False  # takes the window size (or the chunk size of chunked attention)
    rope: bool = False  # takes the step's new K/V and RoPE frequencies, returns the rotated K
    page_inputs: int = 2  # K and V arrays, or quantized pages' one array of rows
    reduce_kernel: Any = None
    reduce_grid: tuple[int, int, int] = (0, 0, 0)
    launch_eager: Callable = field(init=False, compare=False, repr=False)
    launch: Callable = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        eager = _launch_function(self)
        object.__setattr__(self, "launch_eager", eager)
        object.__setattr__(self, "launch", mx.compile(eager))


@functools.lru_cache(maxsize=512)
def launch_plan(
    backend: str,
    dtype: mx.Dtype,
    num_seqs: int,
    num_heads: int,
    num_queries: int,
    head_dim: int,
    block_size: int,
    num_kv_heads: int,
    table_blocks: int,
    sliding_window: bool,
    kernel: str | None = None,
    partition_size: int | None = None,
    rope: bool = False,
    bits: tuple[int, int, int] = (16, 16, 0),
    value_dim: int = 0,
    chunked: bool = False,
    softcap: bool = False,
    flat_output: bool = False,
) -> LaunchPlan:
    """The plan of one shape (see `paged_attention_decode` for the arguments; `rope`: the
    `decode_rope_*` kernels; `bits`: K bits, V bits and group size of quantized pages;
    `value_dim`: V's head size where it is not K's; `chunked`, `softcap`: `KernelSpec`'s);
    raises `UnsupportedSpecError` for a shape the kernels cannot serve."""
    if num_heads % num_kv_heads:
        raise UnsupportedSpecError(
            f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads"
        )
    groups = num_seqs * num_kv_heads
    table_tokens = table_blocks * block_size
    kernel, partition_size = _kernel_and_partition(
        kernel, partition_size, backend, dtype, head_dim, block_size, groups, table_tokens,
        bits, value_dim, plain_scores=not (chunked or softcap),
    )  # fmt: skip
    spec = KernelSpec(
        kernel, backend, dtype_name(dtype), head_dim, block_size, num_heads // num_kv_heads,
        partition_size, sliding_window, rope, *bits, value_dim, chunked, softcap,
    )  # fmt: skip
    if num_queries != 1:
        raise UnsupportedSpecError(
            f"{spec.name}: decode kernels take one query per row, not {num_queries}"
        )
    shapes = dict(
        groups=groups, out_shape=_out_shape(num_seqs, num_heads, num_queries, spec, flat_output),
        dtype=dtype,
        window=sliding_window or chunked, rope=rope, page_inputs=1 if spec.quantized else 2,
    )  # fmt: skip
    tg = _threads(spec)
    if not spec.partitioned:
        grid = (tg * num_kv_heads, num_seqs, 1)
        return LaunchPlan(spec.name, build(spec), grid, (tg, 1, 1), (), False, **shapes)
    num_partitions = math.ceil(table_tokens / partition_size)
    grid = (tg * num_kv_heads, num_seqs, num_partitions)
    if spec.fused_reduce:
        # The three partials in one flat array (see `paged_attention.jinja`).
        packed = ((num_seqs * num_heads * num_partitions * (spec.v_dim + 2),),)
        return LaunchPlan(
            spec.name, build(spec), grid, (tg, 1, 1), packed, True, counter_slots=groups, **shapes
        )
    return _two_pass_plan(spec, grid, tg, (num_seqs, num_heads, num_partitions), shapes)


def _out_shape(num_seqs: int, num_heads: int, num_queries: int, spec: KernelSpec, flat: bool):
    """`(B, Hq, 1, Dv)`, or with `flat` the same rows as `(B, Hq * Dv)` (what an output
    projection reads: the kernels write flat rows either way)."""
    if not flat:
        return (num_seqs, num_heads, num_queries, spec.v_dim)
    if spec.rope:
        raise UnsupportedSpecError(f"{spec.name}: the RoPE kernels hand back (B, Hq, 1, D)")
    return (num_seqs, num_heads * num_queries * spec.v_dim)


def _two_pass_plan(spec: KernelSpec, grid, tg: int, rows: tuple, shapes: dict) -> LaunchPlan:
    """Pass 1 writes fp32 partials per partition of `rows` (sequences, heads, partitions);
    `decode_reduce` merges them."""
    reduce = dataclasses.replace(
        spec, kernel="decode_reduce", rope=False, k_bits=16, v_bits=16, group_size=0,
        softcap=False,
    )  # fmt: skip
    partials = ((*rows, spec.v_dim), rows, rows)
    num_seqs, num_heads, _ = rows
    return LaunchPlan(
        spec.name, build(spec), grid, (tg, 1, 1), partials, False, reduce_kernel=build(reduce),
        reduce_grid=(num_heads * 32, num_seqs, 1), **shapes,
    )  # fmt: skip


def _kernel_and_partition(
    kernel,
    partition_size,
    backend,
    dtype,
    head_dim,
    block_size,
    groups,
    table_tokens,
    bits,
    value_dim,
    plain_scores=True,
) -> tuple[str, int]:
    """The routed kernel and partition length, or the forced `kernel`'s (with the partition
    length routing would give it unless `partition_size` is set)."""
    if kernel is None:
        return route(backend, dtype, head_dim, block_size, groups, table_tokens, bits, value_dim,
                     plain_scores)  # fmt: skip
    if kernel not in KERNELS or KERNELS[kernel].split == "reduce":
        raise UnsupportedSpecError(
            f"{kernel!r} is not a kernel to launch (pass 1 kernels: "
            f"{', '.join(k for k in KERNELS if k != 'decode_reduce')})"
        )
    if partition_size is None:
        partition_size = partition_size_for(kernel, groups, table_tokens)
    return kernel, partition_size


def _threads(spec: KernelSpec) -> int:
    """Threads per threadgroup of a pass-1 launch."""
    return define(spec).threads_per_threadgroup


def _launch_function(plan: LaunchPlan) -> Callable:
    """The plan's kernel calls as one function of its input arrays (see `LaunchPlan.launch`).

    Each eager call of an `mx.fast` custom kernel rebuilds the kernel's source text and
    arguments (7-18 µs of host time per call on the H200's host, against about 1 µs for MLX's
    own SDPA); under `mx.compile` a call of the same shapes reuses the traced kernel nodes.
    """
    template = [("T", plan.dtype)]
    out_shape, dtype = plan.out_shape, plan.dtype
    # The rotated key of a RoPE kernel: (B, Hkv, 1, D).
    rotated = [(out_shape[0], plan.groups // out_shape[0], 1, out_shape[3])] if plan.rope else []
    rotated_dtype = [dtype] if plan.rope else []
    partial_dtypes = [mx.float32] * len(plan.partial_shapes)

    def call(inputs, shapes, dtypes):
        return plan.kernel(
            inputs=list(inputs), template=template, grid=plan.grid,
            threadgroup=plan.threadgroup, output_shapes=shapes, output_dtypes=dtypes,
        )  # fmt: skip

    def single(*inputs):
        return call(inputs, [out_shape, *rotated], [dtype, *rotated_dtype])

    def fused(*inputs):
        shapes = [out_shape, *plan.partial_shapes, *rotated, inputs[-1].shape]
        outputs = call(inputs, shapes, [dtype, *partial_dtypes, *rotated_dtype, mx.int32])
        return [outputs[0], *outputs[1 + len(partial_dtypes) :]]

    def two_pass(*inputs):
        shapes = [*plan.partial_shapes, *rotated]
        outputs = call(inputs, shapes, partial_dtypes + rotated_dtype)
        lens = 2 + plan.page_inputs  # after the queries, the pages and the block tables
        out = plan.reduce_kernel(  # the partials, seq_lens and the window (or chunk) if any
            inputs=[*outputs[:3], inputs[lens], *inputs[lens + 2 : lens + 2 + plan.window]],
            template=template,
            grid=plan.reduce_grid,
            threadgroup=(32, 1, 1),
            output_shapes=[out_shape],
            output_dtypes=[dtype],
        )[0]
        return [out, *outputs[3:]]

    if not plan.partial_shapes:
        return single
    return fused if plan.fused else two_pass
