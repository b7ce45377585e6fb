"""Which paged decode kernels the launcher runs: the specs of one attention shape, the routed
tuning variant and partition length, and the single-pass / split-K rule, all from the H200
sweeps in docs/kernels.md."""

from __future__ import annotations

import functools
import math

import mlx.core as mx

from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError

DEFAULT_PARTITION_SIZE = 512
# CUDA's routed split-K (tensor cores, fused reduce) takes longer partitions: a threadgroup's
# fixed costs weigh less and no reduce launch follows (H200 sweep in docs/kernels.md).
FUSED_PARTITION_SIZE = 1024
FUSED_LONG_PARTITION_SIZE = 2048  # past FUSED_LONG_CONTEXT tokens of block table
FUSED_LONG_CONTEXT = 16384
# ... except for few (sequence, KV head) groups (under MMA_SINGLE_PASS_MIN_GROUPS): there the
# length whose threadgroups come closest to two per SM (the most `mma_u2_fused` fits), as in
# the H200 sweeps with the kernel's tiny inputs out of MLX's small pool (docs/kernels.md):
# 1 x 32k, 8 groups, ran 58.8 µs at 1024 tokens against 63.6 at 2048; 2 x 32k best at 2048;
# 4 x 32k 155.0 at 4096 against 158.4 at 2048.
FEW_GROUPS_PARTITION_SIZES = (1024, 2048, 4096)
FEW_GROUPS_TARGET_THREADGROUPS = 256
# `pg` variant: how many threadgroups the launcher aims the partitions at. 132 SMs x 3
# threadgroups of 152-168 registers on the H200 (`mma_fused`; `u2` fits 2). Measured no faster
# than the routed partitions (docs/kernels.md), so not routed.
GRID_TARGET_THREADGROUPS = 396
# Routing between the single-pass and split-K kernels, from the H200 sweep in docs/kernels.md:
# with enough (sequence, KV head) threadgroups to fill the GPU, splitting the context only adds
# the reduce pass; with few, the partitions are where the parallelism comes from.
SINGLE_PASS_MIN_GROUPS = 1024
SINGLE_PASS_MIN_GROUPS_SHORT = 512   # ... and with at most this many partitions
SHORT_PARTITIONS = 4
# The tensor-core kernels (H200 sweeps, docs/kernels.md "Routing"): a lone threadgroup on an
# SM streams 50-80 GB/s, and every split adds a start, partials, a merge and host time, so the
# single pass wins from 40 groups (5 x 8k: 67.5 µs single, 87.3 split-K), and at any count on
# tables of up to 2048 tokens (1 x 2k: 28.1 against 35.2) ...
MMA_SINGLE_PASS_MIN_GROUPS = 40
MMA_SHORT_TABLE_TOKENS = 2048
# ... except on long tables whose second wave of single-pass threadgroups (264 `mma_s3` ones
# fit at once) is under three quarters full: it streams alone for long (48 x 32k, 384 groups:
# 1,655 µs single, 1,568 split-K; 64 x 32k, 512 groups: 1,978 single, 2,088 split-K).
MMA_RESIDENT_THREADGROUPS = 264
# Up to this many groups the single pass's threadgroups cannot together saturate DRAM with 4
# simdgroups (about 54 GB/s each), so it runs 8 (`mma_s3_w8`: 8 x 32k 269.6 µs against 311.7);
# from 80 groups 8 contend and lose (11 x 32k: 401.6 against 373.1).
MMA_WIDE_MAX_GROUPS = 72
# Head sizes routed to the tensor cores. At head_dim 64, under the same rules as at 128, they
# took 0.59-0.87x the FMA kernel's time at every shape of the H200 sweep (64 x 32k: 1,057
# against 1,522 µs); 80, 96 and 256 have no sweep yet.
MMA_HEAD_DIMS = (64, 128)


_DTYPE_NAMES = {mx.float16: "float16", mx.bfloat16: "bfloat16", mx.float32: "float32"}


@functools.lru_cache(maxsize=None)
def decode_specs(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int, gqa: int,
                 sliding_window: bool, partition_size: int = DEFAULT_PARTITION_SIZE,
                 variant: str = "") -> tuple[KernelSpec, KernelSpec, KernelSpec]:
    """(single pass, pass 1, pass 2) specs for one attention shape; `variant` is a tuning
    suffix for pass 1 (e.g. "s2_w8", see KernelSpec)."""
    if dtype not in _DTYPE_NAMES:
        raise UnsupportedSpecError(f"paged decode kernels take float16/bfloat16/float32 "
                                   f"pages, not {dtype}")
    args = (backend, _DTYPE_NAMES[dtype], head_dim, block_size, gqa)
    tuning = KernelSpec.parse_tuning(variant)
    single_tuning = {k: v for k, v in tuning.items()  # the split-K-only ones dropped
                     if k not in ("fused_reduce", "grid_partitions", "dynamic_pages")}
    return (KernelSpec("paged_decode", *args, 0, sliding_window, **single_tuning),
            KernelSpec("paged_decode", *args, partition_size, sliding_window, **tuning),
            KernelSpec("paged_decode_reduce", *args, partition_size, sliding_window))


def routed_variant(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int,
                   table_tokens: int = 1) -> str:
    """The pass-1 variant the launcher runs when none is asked for, given the block table's
    width in tokens. On CUDA at the MMA_HEAD_DIMS where the tensor cores serve the shape
    (bf16/fp16, blocks of 16/32): up to FUSED_LONG_CONTEXT tokens `mma_s3_fused` (K/V through
    a 3-slot cp.async ring), past it `mma_u2_fused` (two sub-pages in registers per step), each
    the faster of the two in the H200 sweep at head_dim 128 (docs/kernels.md). Elsewhere, and
    at head sizes not yet measured, the FMA loop ("")."""
    if (backend == "cuda" and dtype in (mx.bfloat16, mx.float16) and head_dim in MMA_HEAD_DIMS
            and block_size % 16 == 0):
        return "mma_u2_fused" if table_tokens > FUSED_LONG_CONTEXT else "mma_s3_fused"
    return ""


def routed_single_pass_variant(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int,
                               groups: int) -> str:
    """The variant whose single pass the launcher runs for `groups` (sequence, KV head) pairs
    when it picks the single pass: where the tensor cores serve the shape, `mma_s3_w8` up to
    MMA_WIDE_MAX_GROUPS and `mma_s3` past it, at every context (faster than `mma_u2`'s at 32k
    in the H200 sweep: 1,012 against 1,062 µs at 32 x 32k); else the FMA loop."""
    if not routed_variant(backend, dtype, head_dim, block_size):
        return ""
    return "mma_s3_w8" if groups <= MMA_WIDE_MAX_GROUPS else "mma_s3"


def routed_partition_size(variant: str, table_tokens: int, groups: int) -> int:
    """Split-K partition length for `variant` when `table_tokens` is the block table's width
    and `groups` the (sequence, KV head) pairs."""
    if "fused" not in variant.split("_"):
        return DEFAULT_PARTITION_SIZE
    if table_tokens <= FUSED_LONG_CONTEXT:
        return FUSED_PARTITION_SIZE
    if groups >= MMA_SINGLE_PASS_MIN_GROUPS:
        return FUSED_LONG_PARTITION_SIZE
    return min(FEW_GROUPS_PARTITION_SIZES, key=lambda size: abs(
        groups * math.ceil(table_tokens / size) - FEW_GROUPS_TARGET_THREADGROUPS))


def grid_partitions(groups: int, max_partitions: int,
                    target: int = GRID_TARGET_THREADGROUPS, min_fill: float = 0.9) -> int:
    """Partitions per (sequence, KV head) for the `pg` variant: the fewest whose threadgroups
    fill their last wave of `target` to `min_fill` (else the best-filled), and no more than
    `max_partitions`, so none is shorter than the spec's partition."""
    best, best_fill = 1, 0.0
    for parts in range(1, max(1, max_partitions) + 1):
        waves = groups * parts / target
        fill = waves / math.ceil(waves)
        if fill >= min_fill:
            return parts
        if fill > best_fill:
            best, best_fill = parts, fill
    return best


def use_single_pass(num_seqs: int, num_kv_heads: int, num_partitions: int,
                    tensor_cores: bool = False, table_tokens: int = 0) -> bool:
    """The measured routing rule between the single-pass and the split-K kernels
    (`tensor_cores`: the routed variant is an `mma` one, whose rule needs `table_tokens`, the
    block table's width in tokens)."""
    groups = num_seqs * num_kv_heads
    if num_partitions == 1:
        return True
    if tensor_cores:
        if table_tokens <= 0:
            raise ValueError("the tensor-core routing rule needs the block table's width")
        if table_tokens <= MMA_SHORT_TABLE_TOKENS:
            return True
        partial_second_wave = (MMA_RESIDENT_THREADGROUPS < groups
                               < MMA_RESIDENT_THREADGROUPS * 7 // 4)
        return (groups >= MMA_SINGLE_PASS_MIN_GROUPS
                and not (table_tokens > FUSED_LONG_CONTEXT and partial_second_wave))
    return (groups >= SINGLE_PASS_MIN_GROUPS
            or (groups >= SINGLE_PASS_MIN_GROUPS_SHORT and num_partitions <= SHORT_PARTITIONS))


def routed_specs(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int, gqa: int,
                 sliding_window: bool) -> list[KernelSpec]:
    """Every spec the launcher's routing can call for one attention shape."""
    specs = []
    for groups in (1, MMA_WIDE_MAX_GROUPS + 1):  # the single pass changes only past this count
        variant = routed_single_pass_variant(backend, dtype, head_dim, block_size, groups)
        spec = decode_specs(backend, dtype, head_dim, block_size, gqa, sliding_window,
                            DEFAULT_PARTITION_SIZE, variant)[0]
        if spec not in specs:
            specs.append(spec)
    for tokens in (1, FUSED_LONG_CONTEXT + 1):  # the routing changes only past this width
        variant = routed_variant(backend, dtype, head_dim, block_size, tokens)
        sizes = {routed_partition_size(variant, tokens, MMA_SINGLE_PASS_MIN_GROUPS)}
        if tokens > FUSED_LONG_CONTEXT and "fused" in variant.split("_"):
            sizes.update(FEW_GROUPS_PARTITION_SIZES)
        for size in sorted(sizes):
            _, part1, part2 = decode_specs(backend, dtype, head_dim, block_size, gqa,
                                           sliding_window, size, variant)
            for spec in [part1] if part1.fused_reduce else [part1, part2]:
                if spec not in specs:
                    specs.append(spec)
    return specs
