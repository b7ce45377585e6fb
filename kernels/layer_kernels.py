"""Kernels that fold a decode layer's small ops into single nodes (`runtime/models/lean_fused.py`):
the residual add with the RMSNorm after it (`add_rms_norm.jinja`), SwiGLU read from the stacked
gate/up output (`swiglu.jinja`), and the q/k/v heads cut from the stacked projection, normed and
rotated (`qkv_rope.jinja`). Metal and CUDA from one template each; on the CPU, and wherever no
GPU backend is named, each launcher runs its MLX reference, which is mlx-lm's own ops.

MLX spends its host time per graph node, whatever the node computes: each kernel here stands for
2 to 9 of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from mlx_paged.codegen.build import KernelDefinition, check_definition, compile_kernel
from mlx_paged.codegen.environment import render, render_macro
from mlx_paged.kernels.kernel_inputs import constant
from mlx_paged.kernels.kernel_spec import BACKENDS, DTYPE_SHORT, DTYPES, UnsupportedSpecError

TEMPLATES = Path(__file__).resolve().parent
KINDS = ("add_rms_norm", "swiglu", "qkv_rope")
NORM_THREADS = 256  # one threadgroup a row of `add_rms_norm`
ELEMENT_THREADS = 256  # threadgroup size of `swiglu`'s one thread a value


@dataclass(frozen=True)
class LayerKernelSpec:
    """One layer kernel (`kind`) on one backend and dtype; `qkv_rope` also at one head layout
    (`qkn`: with qwen3's per-head RMSNorm of queries and keys; `pages`: writing keys and values
    into the pages), e.g. `qkv_rope_cuda_bf16_hd128_h32k8_qkn`, `add_rms_norm_metal_f16`."""

    kind: str
    backend: str
    dtype: str
    head_dim: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    qk_norm: bool = False
    writes_pages: bool = False

    def __post_init__(self):
        if self.kind not in KINDS or self.backend not in BACKENDS or self.dtype not in DTYPES:
            raise UnsupportedSpecError(f"{self.name}: not a layer kernel ({', '.join(KINDS)})")
        heads = (self.head_dim, self.num_heads, self.num_kv_heads)
        if self.kind == "qkv_rope":
            if min(heads) < 1 or self.head_dim % 2 or self.num_heads % self.num_kv_heads:
                raise UnsupportedSpecError(f"{self.name}: needs an even head size and GQA heads")
        elif any(heads) or self.qk_norm or self.writes_pages:
            raise UnsupportedSpecError(f"{self.name}: only qkv_rope takes a head layout")

    @property
    def name(self) -> str:
        base = f"{self.kind}_{self.backend}_{DTYPE_SHORT.get(self.dtype, self.dtype)}"
        if self.kind != "qkv_rope":
            return base
        flags = ("_qkn" if self.qk_norm else "") + ("_pages" if self.writes_pages else "")
        return f"{base}_hd{self.head_dim}_h{self.num_heads}k{self.num_kv_heads}{flags}"

    @property
    def threads(self) -> int:
        return {"add_rms_norm": NORM_THREADS, "swiglu": ELEMENT_THREADS, "qkv_rope": 32}[self.kind]

    @classmethod
    def parse(cls, name: str) -> LayerKernelSpec:
        """Inverse of `name`."""
        kind = next((k for k in KINDS if name.startswith(k + "_")), None)
        try:
            backend, dtype, *rest = name.removeprefix(f"{kind}_").split("_")
            dtype = {short: full for full, short in DTYPE_SHORT.items()}[dtype]
            if kind != "qkv_rope":
                if rest:
                    raise ValueError(name)
                return cls(kind, backend, dtype)
            head_dim, heads = int(rest[0].removeprefix("hd")), rest[1].removeprefix("h")
            num_heads, num_kv_heads = (int(x) for x in heads.split("k"))
            flags = rest[2:]
            if flags not in ([], ["qkn"], ["pages"], ["qkn", "pages"]):
                raise ValueError(name)
            return cls(kind, backend, dtype, head_dim, num_heads, num_kv_heads, "qkn" in flags,
                       "pages" in flags)  # fmt: skip
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise UnsupportedSpecError(
                f"{name!r} is not a layer kernel name (e.g. add_rms_norm_metal_bf16, "
                f"swiglu_cuda_f16, qkv_rope_cuda_bf16_hd128_h32k8_qkn)"
            ) from exc


_NAMES = {
    "add_rms_norm": (("h", "r", "w", "eps"), ("total", "normed")),
    "swiglu": (("gate_up",), ("out",)),
    "qkv_rope": (("qkv", "positions", "rope_inv_freq"), ("queries", "keys", "values")),
}


def define(spec: LayerKernelSpec) -> KernelDefinition:
    """The kernel's definition (inputs and outputs as the launchers below pass them)."""
    inputs, outputs = _NAMES[spec.kind]
    if spec.qk_norm:
        inputs = (*inputs, "q_norm", "k_norm", "eps")
    if spec.writes_pages:
        inputs, outputs = (*inputs, "k_pages", "v_pages", "slots"), outputs[:1]
    return check_definition(
        KernelDefinition(
            name=spec.name,
            backend=spec.backend,
            spec=spec,
            source=render(TEMPLATES, f"{spec.kind}.jinja", spec),
            header=render_macro(TEMPLATES, "_dialect.jinja", "cuda_warp_sum", spec),
            input_names=inputs,
            output_names=outputs,
            threads_per_threadgroup=spec.threads,
            threadgroup_bytes=4 * NORM_THREADS // 32 if spec.kind == "add_rms_norm" else 0,
            row_contiguous_inputs=True,
        )
    )


@functools.cache
def build(spec: LayerKernelSpec):
    """The `mx.fast` kernel object of `spec`, built once per process."""
    return compile_kernel(define(spec))


@functools.cache
def _kernel(kind: str, backend: str, dtype: mx.Dtype, heads=(0, 0, 0), qk_norm=False,
            writes_pages=False):  # fmt: skip
    """The kernel object a launcher calls, by plain key: no spec is built and checked again on
    every call of a decode step."""
    head_dim, num_heads, num_kv_heads = heads
    spec = LayerKernelSpec(kind, backend, _dtype_name(dtype), head_dim, num_heads, num_kv_heads,
                           qk_norm, writes_pages)  # fmt: skip
    return build(spec)


def add_rms_norm(h: mx.array, r: mx.array, weight: mx.array, eps: float, backend: str | None):
    """`(h + r, rms_norm(h + r) * weight)` of `(B, D)` rows: one kernel on `backend`, MLX's
    two ops where it is None."""
    if backend is None:
        total = h + r
        return total, mx.fast.rms_norm(total, weight, eps)
    if r.dtype != h.dtype or weight.dtype != h.dtype:
        raise UnsupportedSpecError(
            f"add_rms_norm: the residual {h.dtype}, the update {r.dtype} and the norm weight "
            f"{weight.dtype} must share one dtype"
        )
    rows, dim = h.shape
    return _kernel("add_rms_norm", backend, h.dtype)(
        inputs=[h, r, weight, constant(float(eps), mx.float32, backend)],
        template=[("T", h.dtype)],
        grid=(rows * NORM_THREADS, 1, 1),
        threadgroup=(NORM_THREADS, 1, 1),
        output_shapes=[(rows, dim), (rows, dim)],
        output_dtypes=[h.dtype, h.dtype],
    )


def swiglu(gate_up: mx.array, backend: str | None) -> mx.array:
    """`silu(gate) * up` of `(B, 2I)` stacked gate and up outputs: one kernel on `backend`,
    mlx-lm's `swiglu` of the two halves where it is None."""
    if backend is None:
        return mlx_lm_swiglu(*mx.split(gate_up, 2, axis=-1))
    rows, width = gate_up.shape[0], gate_up.shape[1] // 2
    threads = -(-rows * width // ELEMENT_THREADS) * ELEMENT_THREADS
    return _kernel("swiglu", backend, gate_up.dtype)(
        inputs=[gate_up],
        template=[("T", gate_up.dtype)],
        grid=(threads, 1, 1),
        threadgroup=(ELEMENT_THREADS, 1, 1),
        output_shapes=[(rows, width)],
        output_dtypes=[gate_up.dtype],
    )[0]


def qkv_rope(
    qkv: mx.array,
    positions: mx.array,
    inv_freq: mx.array,
    heads: tuple[int, int, int],
    backend: str,
    norms: tuple[mx.array, mx.array, float] | None = None,
) -> tuple[mx.array, mx.array, mx.array]:
    """Queries `(B, H, 1, D)`, keys and values `(B, Hkv, D)` of a decode step from its stacked
    projection `qkv` `(B, (H + 2 Hkv) * D)` (`heads` = (H, Hkv, D)), the queries and keys
    rotated at `positions` `(B,)` by `inv_freq` (the angle of each rotated pair per position),
    after per-head RMSNorm with `norms` = (q weight, k weight, eps) where given. One kernel;
    the caller runs the model's own ops off the GPU."""
    rows, (num_heads, num_kv_heads, head_dim) = qkv.shape[0], heads
    shapes = [(rows, num_heads, 1, head_dim)] + [(rows, num_kv_heads, head_dim)] * 2
    return tuple(_qkv_rope_call(qkv, positions, inv_freq, heads, backend, norms, [], shapes))


def qkv_rope_into_pages(
    qkv: mx.array,
    positions: mx.array,
    inv_freq: mx.array,
    heads: tuple[int, int, int],
    backend: str,
    norms: tuple[mx.array, mx.array, float] | None,
    pages: tuple[mx.array, mx.array],
    slots: mx.array,
) -> mx.array:
    """`qkv_rope`'s queries, with row b's keys and values written into the flat 16-bit
    `pages` `(slots, Hkv, D)` (K, V) at `slots[b]` by the same kernel, in place: MLX does
    not know of the write, so only an attention that takes these queries may read the pages
    in this step. The pages must be row-contiguous arrays of their own (the pool's are): MLX
    would hand the kernel a copy of any other, and the write would be lost with it."""
    k_pages, v_pages = pages
    for array in pages:
        if array.dtype != qkv.dtype or array.shape[1:] != (heads[1], heads[2]):
            raise UnsupportedSpecError(
                f"qkv_rope: pages {array.shape} {array.dtype} do not hold {qkv.dtype} rows of "
                f"{heads[1]} heads of {heads[2]}"
            )
    shape = (qkv.shape[0], heads[0], 1, heads[2])
    if slots.dtype != mx.int32 or slots.size != qkv.shape[0]:
        raise UnsupportedSpecError(
            f"qkv_rope: slots must be int32, one a row, not {slots.dtype} {slots.shape}"
        )
    extra = [k_pages, v_pages, slots]  # as given: a reshape would be one more node a layer
    return _qkv_rope_call(qkv, positions, inv_freq, heads, backend, norms, extra, [shape])[0]


def _qkv_rope_call(qkv, positions, inv_freq, heads, backend, norms, pages: list, shapes: list):
    """One `qkv_rope` kernel node: `pages` (K pages, V pages, slots) or none; `shapes` its
    outputs'."""
    num_heads, num_kv_heads, head_dim = heads
    if norms is not None and {norms[0].dtype, norms[1].dtype} != {qkv.dtype}:
        raise UnsupportedSpecError(f"qkv_rope: the norm weights must be {qkv.dtype}")
    kernel = _kernel("qkv_rope", backend, qkv.dtype, (head_dim, num_heads, num_kv_heads),
                     norms is not None, bool(pages))  # fmt: skip
    inputs = [qkv, positions.astype(mx.int32), inv_freq.astype(mx.float32)]
    if norms is not None:
        inputs += [norms[0], norms[1], constant(float(norms[2]), mx.float32, backend)]
    return kernel(
        inputs=inputs + pages,
        template=[("T", qkv.dtype)],
        grid=(qkv.shape[0] * (num_heads + 2 * num_kv_heads) * 32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=shapes,
        output_dtypes=[qkv.dtype] * len(shapes),
    )


def _dtype_name(dtype: mx.Dtype) -> str:
    for name in DTYPES:
        if getattr(mx, name) == dtype:
            return name
    raise UnsupportedSpecError(f"layer kernels take {', '.join(DTYPES)}, not {dtype}")


def sample_call(spec: LayerKernelSpec) -> tuple:
    """(threads a threadgroup, inputs, output shapes, output dtypes, grid) of a representative
    call of `spec`: 8 rows (`metal_capture.py`)."""
    dtype, rows, dim = getattr(mx, spec.dtype), 8, 256
    if spec.kind == "add_rms_norm":
        x = mx.zeros((rows, dim), dtype)
        inputs = [x, x, mx.zeros((dim,), dtype), mx.array([1e-5], mx.float32)]
        return NORM_THREADS, inputs, [(rows, dim)] * 2, [dtype] * 2, (rows * NORM_THREADS, 1, 1)
    if spec.kind == "swiglu":
        inputs = [mx.zeros((rows, 2 * dim), dtype)]
        return ELEMENT_THREADS, inputs, [(rows, dim)], [dtype], (rows * dim, 1, 1)
    heads, kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    inputs = [mx.zeros((rows, (heads + 2 * kv_heads) * head_dim), dtype),
              mx.zeros((rows,), mx.int32), mx.zeros((head_dim // 2,), mx.float32)]  # fmt: skip
    if spec.qk_norm:
        inputs += [mx.zeros((head_dim,), dtype)] * 2 + [mx.array([1e-6], mx.float32)]
    shapes = [(rows, heads, 1, head_dim)] + [(rows, kv_heads, head_dim)] * 2
    if spec.writes_pages:
        inputs += [mx.zeros((64, kv_heads, head_dim), dtype)] * 2 + [mx.zeros((rows,), mx.int32)]
        shapes = shapes[:1]
    grid = (rows * (heads + 2 * kv_heads) * 32, 1, 1)
    return 32, inputs, shapes, [dtype] * len(shapes), grid


def layer_kernel_specs(backend: str) -> list[LayerKernelSpec]:
    """A sample in which each kind, dtype and head layout appears (compile checks, `kernels
    list`)."""
    specs = [LayerKernelSpec(kind, backend, dtype) for kind in KINDS[:2] for dtype in DTYPES]
    layouts = [(64, 32, 8, False, False), (128, 32, 8, True, False), (128, 16, 16, False, True),
               (128, 32, 8, True, True), (80, 12, 4, False, False)]  # fmt: skip
    specs += [
        LayerKernelSpec("qkv_rope", backend, DTYPES[i % len(DTYPES)], *layout)
        for i, layout in enumerate(layouts)
    ]
    return specs
