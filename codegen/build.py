"""From rendered kernel text to a callable MLX kernel: `KernelDefinition` (what MLX needs), the
render-time checks every backend's limits call for, and `compile_kernel`. Kernels call this
layer; it knows none of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

MAX_THREADGROUP_BYTES = 32 * 1024  # Metal's threadgroup-memory limit, for everything on Metal
MAX_CUDA_STATIC_SHARED = 48 * 1024  # static __shared__ per block; more must be dynamic
MAX_CUDA_SHARED = 227 * 1024  # static + dynamic per block on an H100/H200
MLX_CUDA_DYNAMIC_THRESHOLD = 48000  # MLX opts a kernel into more dynamic memory above this
MAX_THREADS_PER_THREADGROUP = 1024
MAX_METAL_BUFFERS = 31  # Metal's buffer argument table


class KernelRenderError(ValueError):
    """A rendered kernel breaks a backend limit; the message names the kernel."""


@dataclass(frozen=True)
class KernelDefinition:
    """Everything MLX needs to build one kernel object, plus what the render checks look at.
    `name` is the kernel's (and its symbol's) name, `backend` "metal" or "cuda", `spec` the
    kernel's own description (the dtype is read from it by the CUDA compile check)."""

    name: str
    backend: str
    spec: Any
    source: str
    header: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    threads_per_threadgroup: int
    threadgroup_bytes: int
    ring_bytes: int = 0  # the K/V ring: static threadgroup memory on Metal, dynamic on CUDA
    # MLX copies a strided input to row-contiguous memory before the kernel (its eval, not a
    # graph node) for bodies that index their inputs as flat rows.
    row_contiguous_inputs: bool = False
    notes: dict = field(default_factory=dict, compare=False)

    def num_buffers(self) -> int:
        """Metal buffer slots: each input and output, plus each `_shape`/`_strides`/`_ndim`
        helper MLX adds because the body mentions it."""
        helpers = sum(
            f"{name}{suffix}" in self.source
            for name in self.input_names
            for suffix in ("_shape", "_strides", "_ndim")
        )
        return len(self.input_names) + len(self.output_names) + helpers


def check_definition(defn: KernelDefinition) -> KernelDefinition:
    """Render-time limits every backend must respect; raises `KernelRenderError`."""
    name = defn.name
    total = defn.threadgroup_bytes + defn.ring_bytes
    if defn.backend == "metal" and total > MAX_THREADGROUP_BYTES:
        raise KernelRenderError(
            f"{name}: {total} bytes of threadgroup memory (limit {MAX_THREADGROUP_BYTES})"
        )
    if defn.backend == "cuda" and (
        defn.threadgroup_bytes > MAX_CUDA_STATIC_SHARED or total > MAX_CUDA_SHARED
    ):
        raise KernelRenderError(
            f"{name}: {defn.threadgroup_bytes} static + {defn.ring_bytes} "
            f"dynamic bytes of shared memory (limits "
            f"{MAX_CUDA_STATIC_SHARED}, {MAX_CUDA_SHARED} in all)"
        )
    if not 32 <= defn.threads_per_threadgroup <= MAX_THREADS_PER_THREADGROUP:
        raise KernelRenderError(
            f"{name}: {defn.threads_per_threadgroup} threads per "
            f"threadgroup (32..{MAX_THREADS_PER_THREADGROUP})"
        )
    if defn.num_buffers() > MAX_METAL_BUFFERS:
        raise KernelRenderError(
            f"{name}: {defn.num_buffers()} kernel arguments (Metal allows {MAX_METAL_BUFFERS})"
        )
    for arg in defn.input_names + defn.output_names:
        if arg not in defn.source:
            raise KernelRenderError(f"{name}: argument {arg!r} is never used by the body")
    return defn


def compile_kernel(defn: KernelDefinition):
    """The `mx.fast` kernel object of a checked definition (callers cache it)."""
    common = dict(
        name=defn.name,
        input_names=list(defn.input_names),
        output_names=list(defn.output_names),
        source=defn.source,
        header=defn.header,
        ensure_row_contiguous=defn.row_contiguous_inputs,
    )
    if defn.backend == "metal":
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
        defn.ring_bytes + defn.threadgroup_bytes > MAX_CUDA_STATIC_SHARED
    ):
        return MLX_CUDA_DYNAMIC_THRESHOLD + 1
    return defn.ring_bytes
