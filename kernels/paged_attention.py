"""Launcher of the paged decode-attention kernels (`paged_attention.jinja`, pass 1 or the only
pass; `paged_attention_reduce.jinja`, pass 2). The oracle is `paged_attention_reference`."""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass
from typing import Optional

import mlx.core as mx

from mlx_paged.codegen.build import KernelDefinition, build
from mlx_paged.codegen.build import define as define_cached
from mlx_paged.codegen.environment import render, render_macro
from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError

DEFAULT_PARTITION_SIZE = 512
# CUDA's routed split-K (tensor cores, fused reduce) takes longer partitions: a threadgroup's
# fixed costs weigh less and no reduce launch follows (H200 sweep in docs/kernels.md).
FUSED_PARTITION_SIZE = 1024
FUSED_LONG_PARTITION_SIZE = 2048  # past FUSED_LONG_CONTEXT tokens of block table
FUSED_LONG_CONTEXT = 16384
# `pg` variant: how many threadgroups the launcher aims the partitions at. 132 SMs x 3
# threadgroups of 152-168 registers on the H200 (`mma_fused`; `u2` fits 2). Measured no faster
# than the routed partitions (docs/kernels.md), so not routed.
GRID_TARGET_THREADGROUPS = 396
RING_SLOT_BYTES = 4096  # of K per slot (and as much of V): one page of hd128 bf16 at block 16
# Routing between the single-pass and split-K kernels, from the H200 sweep in docs/kernels.md:
# with enough (sequence, KV head) threadgroups to fill the GPU, splitting the context only adds
# the reduce pass; with few, the partitions are where the parallelism comes from.
SINGLE_PASS_MIN_GROUPS = 1024
SINGLE_PASS_MIN_GROUPS_SHORT = 512   # ... and with at most this many partitions
SHORT_PARTITIONS = 4


@dataclass(frozen=True)
class Geometry:
    """How a pass-1 threadgroup covers one (sequence, KV head, partition)."""

    nsg: int            # simdgroups per threadgroup
    tpr: int            # lanes sharing one K/V row
    epl: int            # head-dim elements per lane (head_dim = tpr * epl)
    chunk: int          # tokens per online-softmax rescale, per row group
    vector_loads: bool  # rows split into 16-byte aligned lane chunks
    stages: int         # 1: K/V loaded into registers; N > 1: an N-slot shared ring per simdgroup
    stage_rows: int     # rows of K (and of V) per ring slot (0 without a ring)
    tensor_cores: bool = False  # mma.sync scores and P.V (CUDA, bf16/fp16)
    mma_k_width: int = 0        # bytes per load of a lane's K slice / V slice on that path
    mma_v_width: int = 0

    def ring_bytes(self, spec: KernelSpec) -> int:
        """Shared memory of the K/V rings of all simdgroups (0 without a ring)."""
        if self.stages < 2:
            return 0
        return self.nsg * self.stages * 2 * self.stage_rows * spec.head_dim * spec.itemsize


def _threadgroup_bytes(nsg: int, spec: KernelSpec) -> int:
    return 4 * nsg * spec.gqa * (spec.head_dim + 2)


def _simdgroups(spec: KernelSpec) -> int:
    """Simdgroups per threadgroup: 4, halved while the merge buffer would pass Metal's 32 KB."""
    nsg = spec.simdgroups
    if not nsg:
        nsg = 4
        while nsg > 1 and _threadgroup_bytes(nsg, spec) > 32 * 1024:
            nsg //= 2
    return nsg


def geometry(spec: KernelSpec) -> Geometry:
    """Lane split and simdgroup count of pass 1 for `spec`."""
    nsg = _simdgroups(spec)
    if spec.tensor_cores:
        return _tensor_core_geometry(spec, nsg)
    vec = 16 // spec.itemsize
    # The widest power-of-two lane split whose lanes still hold a 16-byte vector each.
    candidates = [p for p in (32, 16, 8, 4, 2, 1) if spec.head_dim % p == 0]
    tpr = spec.lanes_per_row or next((p for p in candidates if spec.head_dim // p >= vec),
                                     candidates[-1])
    if spec.head_dim % tpr or spec.block_size * tpr < 32:
        raise UnsupportedSpecError(f"{spec.name}: {tpr} lanes per row must divide head_dim "
                                   f"and leave at most block_size rows per simdgroup")
    epl = spec.head_dim // tpr
    rpw = 32 // tpr
    # Straight into registers unless a ring is asked for: on the H200 the cp.async ring
    # measured no faster (docs/kernels.md), so it stays a tuning variant (`_s2`..`_s4`).
    stages = spec.stages or 1
    stage_rows = 0
    if stages > 1:
        row_bytes = spec.head_dim * spec.itemsize
        if row_bytes % 16:
            raise UnsupportedSpecError(f"{spec.name}: the ring copies 16-byte units; a "
                                       f"{row_bytes}-byte row is not a whole number of them")
        # The largest slice of a page whose K fits a ring slot (power-of-two rows, like blocks).
        stage_rows = spec.block_size
        while stage_rows > rpw and stage_rows * row_bytes > RING_SLOT_BYTES:
            stage_rows //= 2
    tokens = (stage_rows or spec.block_size) // rpw
    # Score registers per chunk: GQA x chunk <= 32.
    chunk = spec.chunk or max(
        [c for c in range(1, tokens + 1) if tokens % c == 0 and c * spec.gqa <= 32], default=1)
    if tokens % chunk:
        raise UnsupportedSpecError(f"{spec.name}: a chunk of {chunk} tokens does not divide "
                                   f"the {tokens} tokens per row group of a step")
    vector_loads = (epl * spec.itemsize) % 16 == 0
    return Geometry(nsg, tpr, epl, chunk, vector_loads, stages, stage_rows)


def _tensor_core_geometry(spec: KernelSpec, nsg: int) -> Geometry:
    """The mma.sync path: a lane group per GQA head, 16-token sub-pages (see the template)."""
    if spec.backend != "cuda":
        raise UnsupportedSpecError(f"{spec.name}: the tensor-core path is CUDA only (mma.sync)")
    if spec.dtype == "float32":
        raise UnsupportedSpecError(f"{spec.name}: the tensor-core path takes bf16/fp16 pages")
    if spec.block_size % 16:
        raise UnsupportedSpecError(f"{spec.name}: the tensor-core path reads 16-token sub-pages")
    if spec.lanes_per_row or spec.chunk:
        raise UnsupportedSpecError(f"{spec.name}: the tensor-core path combines with wN, uN and "
                                   f"sN only")
    stages = spec.stages or 1
    if stages > 1 and spec.unroll > 1 and (stages % spec.unroll or stages < 2 * spec.unroll):
        raise UnsupportedSpecError(f"{spec.name}: with a ring, uU consumes U sub-pages a step "
                                   f"and the next U are in flight: sN needs N a multiple of U "
                                   f"and at least 2U")
    if stages > 1 and spec.unroll > 1 and spec.head_dim > 128:
        raise UnsupportedSpecError(f"{spec.name}: uU with a ring holds U sub-pages' fragments "
                                   f"in registers; head_dim up to 128")
    if spec.swap_operands and (stages < 2 or spec.unroll > 1 or spec.head_dim > 128):
        raise UnsupportedSpecError(f"{spec.name}: kq (K as the A operand) is written for the "
                                   f"one-sub-page ring: it needs sN, no uN, head_dim up to 128")
    if stages > 1 and spec.head_dim % 64:
        raise UnsupportedSpecError(f"{spec.name}: the tensor-core ring swizzles rows in groups "
                                   f"of 8 16-byte chunks (head_dim a multiple of 64)")

    def width(nbytes: int) -> int:
        return next(w for w in (16, 8, 4, 2) if nbytes % w == 0)
    return Geometry(nsg, tpr=4, epl=spec.head_dim // 4, chunk=16, vector_loads=True,
                    stages=stages, stage_rows=16 if stages > 1 else 0, tensor_cores=True,
                    mma_k_width=width(spec.head_dim // 2), mma_v_width=width(spec.head_dim // 4))


def define(spec: KernelSpec) -> KernelDefinition:
    """Render `spec` (pass 1 or pass 2) into a `KernelDefinition`."""
    header = render_macro("_dialect.jinja", "cuda_header", spec)
    window = ("window",) if spec.sliding_window else ()
    if spec.op == "paged_decode":
        geo = geometry(spec)
        if spec.occupancy:
            header = _launch_bounds(spec, geo.nsg * 32) + header
        if spec.fused_reduce and spec.backend != "cuda":
            raise UnsupportedSpecError(f"{spec.name}: the fused reduce is CUDA only (it needs "
                                       f"device-scope fences between threadgroups)")
        outputs = ("partial_out", "partial_max", "partial_sum") if spec.partitioned else ("out",)
        if spec.fused_reduce:
            outputs = ("out",) + outputs
        counters = ("counters",) if spec.fused_reduce else ()
        return KernelDefinition(
            spec=spec, source=render("paged_attention.jinja", spec, geo=geo), header=header,
            input_names=("queries", "k_pages", "v_pages", "block_tables", "seq_lens", "scale")
            + window + counters,
            output_names=outputs, threads_per_threadgroup=geo.nsg * 32,
            threadgroup_bytes=_threadgroup_bytes(geo.nsg, spec), ring_bytes=geo.ring_bytes(spec),
            notes={"geometry": geo})
    return KernelDefinition(
        spec=spec, source=render("paged_attention_reduce.jinja", spec), header=header,
        input_names=("partial_out", "partial_max", "partial_sum", "seq_lens") + window,
        output_names=("out",), threads_per_threadgroup=32, threadgroup_bytes=0)


def _launch_bounds(spec: KernelSpec, threads: int) -> str:
    """Header text that gives the `oN` variant `__launch_bounds__(threads, N)`: MLX writes the
    signature itself, but NVRTC spells `__global__` as a macro and the header comes just before."""
    if spec.backend != "cuda":
        raise UnsupportedSpecError(f"{spec.name}: oN sets CUDA launch bounds; Metal has none")
    return (f"#undef __global__\n#define __global__ __location__(global) "
            f"__launch_bounds__({threads}, {spec.occupancy})\n")


def current_backend() -> Optional[str]:
    """"metal" or "cuda" when MLX's default device is a GPU with that backend, else None."""
    if mx.default_device().type != mx.DeviceType.gpu:
        return None
    if mx.metal.is_available():
        return "metal"
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        return "cuda"
    return None


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
                     if k not in ("fused_reduce", "grid_partitions")}
    return (KernelSpec("paged_decode", *args, 0, sliding_window, **single_tuning),
            KernelSpec("paged_decode", *args, partition_size, sliding_window, **tuning),
            KernelSpec("paged_decode_reduce", *args, partition_size, sliding_window))


def routed_variant(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int,
                   table_tokens: int = 1) -> str:
    """The pass-1 variant the launcher runs when none is asked for, given the block table's
    width in tokens. On CUDA at head_dim 128 where the tensor cores serve the shape (bf16/fp16,
    blocks of 16/32): up to FUSED_LONG_CONTEXT tokens `mma_s3_fused` (K/V through a 3-slot
    cp.async ring), past it `mma_u2_fused` (two sub-pages in registers per step), each the
    faster of the two in the H200 sweep (docs/kernels.md). Elsewhere, and at head sizes not yet
    measured, the FMA loop ("")."""
    if (backend == "cuda" and dtype in (mx.bfloat16, mx.float16) and head_dim == 128
            and block_size % 16 == 0):
        return "mma_u2_fused" if table_tokens > FUSED_LONG_CONTEXT else "mma_s3_fused"
    return ""


def routed_partition_size(variant: str, table_tokens: int) -> int:
    """Split-K partition length for `variant` when `table_tokens` is the block table's width."""
    if "fused" not in variant.split("_"):
        return DEFAULT_PARTITION_SIZE
    return FUSED_LONG_PARTITION_SIZE if table_tokens > FUSED_LONG_CONTEXT else FUSED_PARTITION_SIZE


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


def use_single_pass(num_seqs: int, num_kv_heads: int, num_partitions: int) -> bool:
    """The measured routing rule between the single-pass and the split-K kernels."""
    groups = num_seqs * num_kv_heads
    return (num_partitions == 1 or groups >= SINGLE_PASS_MIN_GROUPS
            or (groups >= SINGLE_PASS_MIN_GROUPS_SHORT and num_partitions <= SHORT_PARTITIONS))


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
        return build(part1)(
            # Fresh zeroed counters per call: MLX's CUDA graphs run calls with no data
            # dependency concurrently, so calls must not share them.
            inputs=inputs + [mx.zeros((num_seqs * num_kv_heads,), dtype=mx.int32)],
            template=template,
            grid=(grid_x, num_seqs, num_partitions), threadgroup=(tg, 1, 1),
            output_shapes=[queries.shape] + partial_shapes,
            output_dtypes=[queries.dtype] + [mx.float32] * 3)[0]
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


def routed_specs(backend: str, dtype: mx.Dtype, head_dim: int, block_size: int, gqa: int,
                 sliding_window: bool) -> list[KernelSpec]:
    """Every spec the launcher's routing can call for one attention shape."""
    specs: list[KernelSpec] = []
    for tokens in (1, FUSED_LONG_CONTEXT + 1):  # the routing changes only past this width
        variant = routed_variant(backend, dtype, head_dim, block_size, tokens)
        single, part1, part2 = decode_specs(backend, dtype, head_dim, block_size, gqa,
                                            sliding_window,
                                            routed_partition_size(variant, tokens), variant)
        for spec in [single, part1] if part1.fused_reduce else [single, part1, part2]:
            if spec not in specs:
                specs.append(spec)
    return specs


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
