"""How a decode kernel spec renders: the lane split of pass 1 (`Geometry`), the
`KernelDefinition` of `paged_attention.jinja` (pass 1 or the only pass) or
`paged_attention_reduce.jinja` (pass 2), and the built kernel object (each once per process)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from mlx_paged.codegen.build import (
    MAX_CUDA_SHARED,
    KernelDefinition,
    check_definition,
    compile_kernel,
)
from mlx_paged.codegen.environment import render, render_macro
from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError

TEMPLATES = Path(__file__).resolve().parent
QUANT_LANE_VALUES = 8  # head-dim values per lane on quantized pages


@dataclass(frozen=True)
class Geometry:
    """How a pass-1 threadgroup covers one (sequence, KV head, partition)."""

    nsg: int  # simdgroups per threadgroup
    tpr: int  # lanes sharing one K/V row
    epl: int  # head-dim elements per lane (head_dim = tpr * epl)
    chunk: int  # tokens per online-softmax rescale, per row group
    vector_loads: bool  # rows split into 16-byte aligned lane chunks
    stages: int  # 1: K/V loaded into registers; N > 1: an N-slot shared ring per simdgroup
    stage_rows: int  # rows of K (and of V) per ring slot (0 without a ring)
    tensor_cores: bool = False  # mma.sync scores and P.V (CUDA, bf16/fp16)
    mma_k_width: int = 0  # bytes per load of a lane's K slice / V slice on that path
    mma_v_width: int = 0
    ring_subpages: int = 1  # 16-token sub-pages a quantized ring step (and slot) takes
    epl_v: int = 0  # V elements per lane (V's head size = tpr * epl_v)

    def ring_bytes(self, spec: KernelSpec) -> int:
        """Shared memory of the K/V rings of all simdgroups (0 without a ring)."""
        if self.stages < 2:
            return 0
        return self.nsg * self.stages * ring_slot_bytes(spec, self.stage_rows, self.ring_subpages)


def ring_slot_bytes(spec: KernelSpec, rows: int = 16, subpages: int | None = None) -> int:
    """One ring slot: `rows` rows of K and of V; on quantized pages, `rows` page rows of each
    of `subpages` sub-pages (default `spec.ring_subpages`), each padded to the slot's row
    stride (`_mma_quant_ring.jinja`)."""
    if not spec.quantized:
        return 2 * rows * spec.head_dim * spec.itemsize
    return (subpages or spec.ring_subpages) * rows * spec.ring_row_stride


def _threadgroup_bytes(nsg: int, spec: KernelSpec) -> int:
    # The merge buffer, plus the new token's scores of a RoPE kernel.
    return 4 * nsg * spec.gqa * (spec.v_dim + 2) + (4 * spec.gqa if spec.rope else 0)


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
    tpr = _lanes_per_row(spec)
    if spec.quantized:
        tpr = spec.head_dim // QUANT_LANE_VALUES
    if spec.block_size * tpr < 32:
        raise UnsupportedSpecError(
            f"{spec.name}: {tpr} lanes per row leave more rows per simdgroup than a block has"
        )
    epl, epl_v = spec.head_dim // tpr, spec.v_dim // tpr
    tokens = spec.block_size // (32 // tpr)
    # Score registers per chunk: GQA x chunk <= 32.
    chunk = max(
        [c for c in range(1, tokens + 1) if tokens % c == 0 and c * spec.gqa <= 32], default=1
    )
    vector_loads = (epl * spec.itemsize) % 16 == 0 and (epl_v * spec.itemsize) % 16 == 0
    return Geometry(nsg, tpr, epl, chunk, vector_loads, stages=1, stage_rows=0, epl_v=epl_v)


def _lanes_per_row(spec: KernelSpec) -> int:
    """The widest power-of-two lane split whose lanes still hold a 16-byte vector each of K
    and of V (few registers a lane, which a large GQA group multiplies)."""
    vec = 16 // spec.itemsize
    dims = (spec.head_dim, spec.v_dim)
    candidates = [p for p in (32, 16, 8, 4, 2, 1) if all(d % p == 0 for d in dims)]
    return next((p for p in candidates if min(dims) // p >= vec), candidates[-1])


def _tensor_core_geometry(spec: KernelSpec, nsg: int) -> Geometry:
    """The mma.sync path: a lane group per GQA head, 16-token sub-pages (see the template)."""
    stages = spec.stages or 1

    def width(nbytes: int) -> int:
        return next(w for w in (16, 8, 4, 2) if nbytes % w == 0)

    return Geometry(
        nsg,
        tpr=4,
        epl=spec.head_dim // 4,
        epl_v=spec.head_dim // 4,
        chunk=16,
        vector_loads=True,
        stages=stages,
        stage_rows=16 if stages > 1 else 0,
        tensor_cores=True,
        mma_k_width=width(spec.head_dim // 2),
        mma_v_width=width(spec.head_dim // 4),
        ring_subpages=_ring_subpages(spec, nsg, stages),
    )


def _ring_subpages(spec: KernelSpec, nsg: int, stages: int) -> int:
    """`spec.ring_subpages` where the rings of that many sub-pages a slot fit in shared memory
    beside the merge buffer (not so for 8 simdgroups on 288-byte rows), else 1."""
    if not spec.quantized or stages < 2 or spec.ring_subpages == 1:
        return 1
    rings = nsg * stages * ring_slot_bytes(spec)
    return spec.ring_subpages if rings + _threadgroup_bytes(nsg, spec) <= MAX_CUDA_SHARED else 1


@functools.cache
def define(spec: KernelSpec) -> KernelDefinition:
    """Render `spec` (pass 1 or pass 2) into a checked `KernelDefinition` (once per process)."""
    header = render_macro(TEMPLATES, "_dialect.jinja", "cuda_header", spec)
    # The window size, or the chunk size of chunked attention (`_visible_keys.jinja`).
    window = ("window",) if spec.sliding_window or spec.chunked else ()
    if spec.is_reduce:
        return check_definition(
            KernelDefinition(
                name=spec.name,
                backend=spec.backend,
                spec=spec,
                source=render(TEMPLATES, "paged_attention_reduce.jinja", spec),
                header=header,
                input_names=("partial_out", "partial_max", "partial_sum", "seq_lens") + window,
                output_names=("out",),
                threads_per_threadgroup=32,
                threadgroup_bytes=0,
            )
        )
    geo = geometry(spec)
    return check_definition(_pass_one(spec, geo, header, window))


def _pass_one(spec: KernelSpec, geo: Geometry, header: str, window: tuple) -> KernelDefinition:
    """Pass 1 (or the single pass): its inputs, outputs and launch sizes."""
    rotated = ("k_roped",) if spec.rope else ()
    outputs = ("partial_out", "partial_max", "partial_sum") if spec.partitioned else ("out",)
    outputs += rotated
    if spec.fused_reduce:
        # One array for the three partials: MLX's host time per call grows by about 1.8 µs
        # with each output.
        outputs = ("out", "partials", *rotated, "counters_next")
    new_token = ("k_new", "v_new", "rope_inv_freq") if spec.rope else ()
    counters = ("counters",) if spec.fused_reduce else ()
    # Quantized pages: K and V share one array (`QuantizedKVPages`); a fused call's counters
    # come last (the launch appends them).
    pages = ("kv_pages",) if spec.quantized else ("k_pages", "v_pages")
    return KernelDefinition(
        name=spec.name,
        backend=spec.backend,
        spec=spec,
        source=render(TEMPLATES, "paged_attention.jinja", spec, geo=geo),
        header=header,
        input_names=("queries", *pages, "block_tables", "seq_lens", "scale")
        + window
        + (("softcap",) if spec.softcap else ())
        + new_token
        + counters,
        output_names=outputs,
        threads_per_threadgroup=geo.nsg * 32,
        threadgroup_bytes=_threadgroup_bytes(geo.nsg, spec),
        ring_bytes=geo.ring_bytes(spec),
        notes={"geometry": geo},
    )


@functools.cache
def build(spec: KernelSpec):
    """The `mx.fast` kernel object of `spec`, built once per process and reused by every call."""
    return compile_kernel(define(spec))
