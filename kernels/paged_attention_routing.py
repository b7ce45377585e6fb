"""Which decode kernel runs for a call, from the H200 sweeps (`docs/kernels.md`, "Routing").

| where                                           | single pass      | split-K                    |
| ----------------------------------------------- | ---------------- | -------------------------- |
| CUDA, bf16/fp16, head_dim 64/128, blocks 16/32  | `decode_tc_wide` | `decode_tc_splitk` p1024   |
|   (`decode_tc` past 72 groups)                  |                  | past 16k tokens:           |
|                                                 |                  | `decode_tc_splitk_direct`  |
|   ... on quantized pages (both sides quantized) | as above         | `decode_tc_splitk` p1024   |
|                                                 |                  | at every width             |
|   ... on other quantized pages (a 16-bit side)  | none             | `decode_tc_splitk_direct`  |
|                                                 |                  | p1024 at every width       |
| everywhere else (Metal, fp32, other head sizes) | `decode_simt`    | `decode_simt_splitk` p512  |
|                                                 |                  | + `decode_reduce`          |

"groups" are (sequence, KV head) pairs, one threadgroup each in a single pass.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import mlx.core as mx

from mlx_paged.kernels.kernel_spec import (
    KERNELS,
    TENSOR_CORE_HEAD_DIMS,
    KernelSpec,
    UnsupportedSpecError,
)
from mlx_paged.kernels.quantized_pages import ring_refuses_quantized

SIMT_PARTITION_SIZE = 512
# The SIMT single pass wins once the groups fill the GPU: then splitting only adds the reduce.
SIMT_SINGLE_PASS_MIN_GROUPS = 1024
SIMT_SINGLE_PASS_MIN_GROUPS_SHORT = 512  # ... or half as many on tables of few partitions
SIMT_SHORT_PARTITIONS = 4
TC_PARTITION_SIZE = 1024
TC_LONG_CONTEXT = 16384  # past this table width the split-K loads K/V straight to registers
TC_LONG_PARTITION_SIZE = 2048
# Few groups on long tables: the partition length whose threadgroups come closest to 256.
TC_FEW_GROUPS_TARGET_THREADGROUPS = 256
# A lone tensor-core threadgroup streams 50-80 GB/s and each split adds a start, partials and
# a merge, so the single pass wins from 40 groups, and on tables of up to 2048 tokens ...
TC_SINGLE_PASS_MIN_GROUPS = 40
TC_SHORT_TABLE_TOKENS = 2048
# ... except on long tables whose second wave of single-pass threadgroups (264 fit at once)
# is under three quarters full.
TC_RESIDENT_THREADGROUPS = 264
# Up to this many groups 8 simdgroups per threadgroup stream faster than 4 (`decode_tc_wide`).
TC_WIDE_MAX_GROUPS = 72

_DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}


class Route(NamedTuple):
    kernel: str
    partition_size: int  # 0 for a single pass


def dtype_name(dtype: mx.Dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise UnsupportedSpecError(
            f"paged decode kernels take float16/bfloat16/float32 pages, not {dtype}"
        )
    return _DTYPE_NAMES[dtype]


def tensor_cores_serve(
    backend: str,
    dtype: mx.Dtype,
    head_dim: int,
    block_size: int,
    value_dim: int = 0,
    plain_scores: bool = True,
) -> bool:
    """Whether the tensor-core kernels are routed for this shape (V heads of K's size, scores
    neither soft-capped nor chunked: `KernelSpec.softcap`, `chunked`)."""
    return (
        not value_dim
        and plain_scores
        and backend == "cuda"
        and dtype in (mx.bfloat16, mx.float16)
        and head_dim in TENSOR_CORE_HEAD_DIMS
        and block_size % 16 == 0
    )


def partition_size_for(kernel: str, groups: int, table_tokens: int) -> int:
    """Tokens per partition of split kernel `kernel` (0 for a single pass)."""
    sizes = KERNELS[kernel].partition_sizes
    if len(sizes) <= 1:
        return sizes[0] if sizes else 0
    # The direct split-K, routed past TC_LONG_CONTEXT tokens.
    if table_tokens <= TC_LONG_CONTEXT:
        return TC_PARTITION_SIZE
    if groups >= TC_SINGLE_PASS_MIN_GROUPS:
        return TC_LONG_PARTITION_SIZE
    return min(
        KERNELS["decode_tc_splitk_direct"].partition_sizes,
        key=lambda size: abs(
            groups * math.ceil(table_tokens / size) - TC_FEW_GROUPS_TARGET_THREADGROUPS
        ),
    )


def route(
    backend: str,
    dtype: mx.Dtype,
    head_dim: int,
    block_size: int,
    groups: int,
    table_tokens: int,
    bits: tuple[int, int, int] = (16, 16, 0),
    value_dim: int = 0,
    plain_scores: bool = True,
) -> Route:
    """The kernel (and partition length) for `groups` (sequence, KV head) pairs over a block
    table `table_tokens` wide, on pages of `bits` (K bits, V bits, group size), with V heads of
    `value_dim` where not K's and scores not `plain_scores` (the SIMT kernels); see the table
    above."""
    if not tensor_cores_serve(backend, dtype, head_dim, block_size, value_dim, plain_scores):
        partitions = math.ceil(table_tokens / SIMT_PARTITION_SIZE)
        if (
            partitions == 1
            or groups >= SIMT_SINGLE_PASS_MIN_GROUPS
            or (groups >= SIMT_SINGLE_PASS_MIN_GROUPS_SHORT and partitions <= SIMT_SHORT_PARTITIONS)
        ):
            return Route("decode_simt", 0)
        return Route("decode_simt_splitk", SIMT_PARTITION_SIZE)
    quantized = min(bits[:2]) < 16
    if quantized and ring_refuses_quantized(*bits[:2]):
        return Route("decode_tc_splitk_direct", TC_PARTITION_SIZE)
    # Long tables of 16-bit pages split on the register path; quantized ones stay on the ring,
    # whose split-K beats the register path's on them at 8k tokens (docs/kernels.md).
    long = table_tokens > TC_LONG_CONTEXT and not quantized
    split = "decode_tc_splitk_direct" if long else "decode_tc_splitk"
    size = partition_size_for(split, groups, table_tokens)
    partial_second_wave = TC_RESIDENT_THREADGROUPS < groups < TC_RESIDENT_THREADGROUPS * 7 // 4
    single = (
        math.ceil(table_tokens / size) == 1
        or table_tokens <= TC_SHORT_TABLE_TOKENS
        or (
            groups >= TC_SINGLE_PASS_MIN_GROUPS
            and not (table_tokens > TC_LONG_CONTEXT and partial_second_wave)
        )
    )
    if single:
        return Route("decode_tc_wide" if groups <= TC_WIDE_MAX_GROUPS else "decode_tc", 0)
    return Route(split, size)


def routed_specs(
    backend: str,
    dtype: mx.Dtype,
    head_dim: int,
    block_size: int,
    gqa: int,
    sliding_window: bool,
    rope: bool = False,
    bits: tuple[int, int, int] = (16, 16, 0),
    value_dim: int = 0,
    chunked: bool = False,
    softcap: bool = False,
) -> list[KernelSpec]:
    """Every spec the routing can call for one attention shape (what `warm_up` compiles);
    `rope`: their `decode_rope_*` forms (the reduce pass has none: it is shared); `bits`: K
    bits, V bits and group size of quantized pages (the reduce reads no pages); `value_dim`: V's
    head size where it is not K's; `chunked`, `softcap`: as `KernelSpec`'s (the reduce
    computes no scores, so it takes no cap)."""
    quantized = min(bits[:2]) < 16
    tensor_cores = tensor_cores_serve(
        backend, dtype, head_dim, block_size, value_dim, not (chunked or softcap)
    )
    if tensor_cores and quantized and ring_refuses_quantized(*bits[:2]):
        sizes = {"decode_tc_splitk_direct": (TC_PARTITION_SIZE,)}  # `route`'s one choice here
    else:
        names = (
            ("decode_tc_wide", "decode_tc", "decode_tc_splitk")
            + (() if quantized else ("decode_tc_splitk_direct",))
            if tensor_cores
            else ("decode_simt", "decode_simt_splitk", "decode_reduce")
        )
        sizes = {name: KERNELS[name].partition_sizes or (0,) for name in names}
    return [
        KernelSpec(
            name,
            backend,
            dtype_name(dtype),
            head_dim,
            block_size,
            gqa,
            size,
            sliding_window,
            rope and name != "decode_reduce",
            *(bits if name != "decode_reduce" else (16, 16, 0)),
            value_dim,
            chunked,
            softcap and name != "decode_reduce",
        )  # fmt: skip
        for name, name_sizes in sizes.items()
        for size in name_sizes
        if not (rope and name == "decode_reduce")
    ]
