"""From a `KernelSpec` to a callable MLX kernel: define (render + check), then build once."""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass, field

import mlx.core as mx

from .spec import KernelSpec

MAX_THREADGROUP_BYTES = 32 * 1024   # Metal's threadgroup-memory limit, for everything on Metal
MAX_CUDA_STATIC_SHARED = 48 * 1024   # static __shared__ per block; more must be dynamic
MAX_CUDA_SHARED = 227 * 1024         # static + dynamic per block on an H100/H200
MLX_CUDA_DYNAMIC_THRESHOLD = 48000   # MLX opts a kernel into more dynamic memory above this
MAX_THREADS_PER_THREADGROUP = 1024
MAX_METAL_BUFFERS = 31               # Metal's buffer argument table

# op -> module whose `define(spec)` returns the op's KernelDefinition
_OP_MODULES = {
    "paged_decode": "mlx_paged.kernels.paged_attention_geometry",
    "paged_decode_reduce": "mlx_paged.kernels.paged_attention_geometry",
}


class KernelRenderError(ValueError):
    """A rendered kernel breaks a backend limit; the message names the spec."""


@dataclass(frozen=True)
class KernelDefinition:
    """Everything MLX needs to build one kernel object, plus what the render checks look at."""

    spec: KernelSpec
    source: str
    header: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    threads_per_threadgroup: int
    threadgroup_bytes: int
    ring_bytes: int = 0  # the K/V ring: static threadgroup memory on Metal, dynamic on CUDA
    notes: dict = field(default_factory=dict, compare=False)

    def num_buffers(self) -> int:
        """Metal buffer slots: each input and output, plus each `_shape`/`_strides`/`_ndim`
        helper MLX adds because the body mentions it."""
        helpers = sum(f"{name}{suffix}" in self.source for name in self.input_names
                      for suffix in ("_shape", "_strides", "_ndim"))
        return len(self.input_names) + len(self.output_names) + helpers


def check_definition(defn: KernelDefinition) -> KernelDefinition:
    """Render-time limits every backend must respect; raises `KernelRenderError`."""
    name = defn.spec.name
    total = defn.threadgroup_bytes + defn.ring_bytes
    if defn.spec.backend == "metal" and total > MAX_THREADGROUP_BYTES:
        raise KernelRenderError(f"{name}: {total} bytes of threadgroup memory "
                                f"(limit {MAX_THREADGROUP_BYTES})")
    if defn.spec.backend == "cuda" and (defn.threadgroup_bytes > MAX_CUDA_STATIC_SHARED
                                        or total > MAX_CUDA_SHARED):
        raise KernelRenderError(f"{name}: {defn.threadgroup_bytes} static + {defn.ring_bytes} "
                                f"dynamic bytes of shared memory (limits "
                                f"{MAX_CUDA_STATIC_SHARED}, {MAX_CUDA_SHARED} in all)")
    if not 32 <= defn.threads_per_threadgroup <= MAX_THREADS_PER_THREADGROUP:
        raise KernelRenderError(f"{name}: {defn.threads_per_threadgroup} threads per "
                                f"threadgroup (32..{MAX_THREADS_PER_THREADGROUP})")
    if defn.num_buffers() > MAX_METAL_BUFFERS:
        raise KernelRenderError(f"{name}: {defn.num_buffers()} kernel arguments "
                                f"(Metal allows {MAX_METAL_BUFFERS})")
    for arg in defn.input_names + defn.output_names:
        if arg not in defn.source:
            raise KernelRenderError(f"{name}: argument {arg!r} is never used by the body")
    return defn


@functools.lru_cache(maxsize=None)
def define(spec: KernelSpec) -> KernelDefinition:
    """Render and check `spec` (cached: each spec renders once per process)."""
    module = importlib.import_module(_OP_MODULES[spec.op])
    return check_definition(module.define(spec))


@functools.lru_cache(maxsize=None)
def build(spec: KernelSpec):
    """The `mx.fast` kernel object of `spec`, built once per process and reused by every call."""
    defn = define(spec)
    common = dict(name=spec.name, input_names=list(defn.input_names),
                  output_names=list(defn.output_names), source=defn.source,
                  header=defn.header, ensure_row_contiguous=False)
    if spec.backend == "metal":
        return mx.fast.metal_kernel(**common)
    return mx.fast.cuda_kernel(**common, shared_memory=cuda_dynamic_shared(defn))


def cuda_dynamic_shared(defn: KernelDefinition) -> int:
    """Dynamic shared memory to request for `defn` on CUDA.

    MLX raises the kernel's dynamic-shared-memory limit only for requests over 48,000 bytes, and
    the default limit is 48 KB minus the static shared memory; a ring that fits under 48,000
    but not beside the static arrays is asked for as 48,001 bytes so the limit is raised.
    """
    if not defn.ring_bytes:
        return 0
    if defn.ring_bytes <= MLX_CUDA_DYNAMIC_THRESHOLD and (
            defn.ring_bytes + defn.threadgroup_bytes > MAX_CUDA_STATIC_SHARED):
        return MLX_CUDA_DYNAMIC_THRESHOLD + 1
    return defn.ring_bytes
