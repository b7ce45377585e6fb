"""How a paged decode-attention spec renders: the lane split of pass 1 (`Geometry`) and the
`KernelDefinition` of `paged_attention.jinja` (pass 1 or the only pass) or
`paged_attention_reduce.jinja` (pass 2)."""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.codegen.build import KernelDefinition
from mlx_paged.codegen.environment import render, render_macro
from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError

RING_SLOT_BYTES = 4096  # of K per slot (and as much of V): one page of hd128 bf16 at block 16

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
    if (spec.l2_prefetch or spec.lazy_rescales or spec.early_loads or spec.phase_trace
            or spec.dynamic_pages):
        raise UnsupportedSpecError(f"{spec.name}: pfN, lr, rtN, ea, tr and dwN are generated "
                                   f"for the tensor-core ring only (mma_sN)")
    if stages > 4:
        raise UnsupportedSpecError(f"{spec.name}: rings of more than 4 slots are generated for "
                                   f"the tensor-core path only (mma_sN)")
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
    if spec.l2_prefetch and (stages < 2 or spec.unroll > 1):
        raise UnsupportedSpecError(f"{spec.name}: pfN prefetches ahead of the one-sub-page "
                                   f"ring: it needs sN and no uN")
    if spec.phase_trace and (stages < 2 or spec.unroll > 1 or spec.swap_operands
                             or (spec.partitioned and not spec.fused_reduce)):
        raise UnsupportedSpecError(f"{spec.name}: tr traces the one-sub-page ring's phases, in "
                                   f"the single pass or the fused split-K: it needs sN, no "
                                   f"uN, no kq, and fused when partitioned")
    if spec.early_loads and (stages < 2 or spec.unroll > 1):
        raise UnsupportedSpecError(f"{spec.name}: ea starts the one-sub-page ring early: it "
                                   f"needs sN and no uN")
    if spec.lazy_rescales and (stages < 2 or spec.unroll > 1 or spec.swap_operands):
        raise UnsupportedSpecError(f"{spec.name}: lr and rtN are written for the one-sub-page "
                                   f"ring: they need sN, no uN, no kq")
    if spec.swap_operands and (stages < 2 or spec.unroll > 1 or spec.head_dim > 128):
        raise UnsupportedSpecError(f"{spec.name}: kq (K as the A operand) is written for the "
                                   f"one-sub-page ring: it needs sN, no uN, head_dim up to 128")
    if spec.dynamic_pages and (stages < 2 or spec.unroll > 1 or spec.swap_operands
                               or spec.early_loads or spec.l2_prefetch):
        raise UnsupportedSpecError(f"{spec.name}: dwN feeds the one-sub-page ring: it needs "
                                   f"sN, and no uN, kq, ea or pfN")
    # A step's copies are issued STAGES - 1 steps ahead, at most two grabs past the current.
    if spec.dynamic_pages and 2 * spec.dynamic_pages * (spec.block_size // 16) < stages - 1:
        raise UnsupportedSpecError(f"{spec.name}: dw{spec.dynamic_pages} grabs fewer sub-pages "
                                   f"than the ring's {stages - 1} in flight span")
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
        trace = ("phase_trace",) if spec.phase_trace else ()
        if spec.fused_reduce:
            # One array for the three partials: MLX's host time per call grows by about
            # 1.8 µs with each output (docs/benchmarks.md, "MLX's host time per output").
            outputs = ("out", "partials") + trace + ("counters_next",)
        else:
            outputs += trace
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
