"""A decode step's new K and V as rows of quantized pages: one kernel on the GPU
(`quantize_rows.jinja`, Metal and CUDA from the one template), MLX ops elsewhere.

On the GPU the write of quantized pages is then this kernel and one scatter a layer, where
16-bit pages take two scatters: MLX's host time per op, not the GPU, sets a decode step's
pace at serving batch sizes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from mlx_paged.codegen.build import KernelDefinition, check_definition, compile_kernel
from mlx_paged.codegen.environment import render
from mlx_paged.kernels.kernel_spec import DTYPE_SHORT, DTYPES, UnsupportedSpecError
from mlx_paged.kernels.quantized_pages import (
    KV_BITS,
    KV_GROUP_SIZES,
    QuantizedKVPages,
    RowLayout,
    pack_rows,
    row_layout,
)

TEMPLATES = Path(__file__).resolve().parent


@dataclass(frozen=True)
class QuantizeRowsSpec:
    """The quantize kernel of one page layout, on one backend."""

    backend: str
    dtype: str
    head_dim: int
    k_bits: int
    v_bits: int
    group_size: int

    def __post_init__(self):
        if self.dtype not in DTYPES or self.group_size not in KV_GROUP_SIZES:
            raise UnsupportedSpecError(f"{self.name}: no quantize kernel for this dtype or group")
        bits = (self.k_bits, self.v_bits)
        if not set(bits) <= set(KV_BITS) or min(bits) == 16 or self.head_dim % self.group_size:
            raise UnsupportedSpecError(f"{self.name}: not a quantized page layout")

    @property
    def name(self) -> str:
        return (
            f"quantize_rows_{self.backend}_{DTYPE_SHORT.get(self.dtype, self.dtype)}"
            f"_hd{self.head_dim}_k{self.k_bits}v{self.v_bits}gs{self.group_size}"
        )

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2

    @classmethod
    def parse(cls, name: str) -> QuantizeRowsSpec:
        """Inverse of `name` (e.g. `quantize_rows_cuda_bf16_hd128_k4v4gs32`)."""
        try:
            backend, dtype, hd, bits = name.removeprefix("quantize_rows_").split("_")
            k, rest = bits.removeprefix("k").split("v")
            v, group = rest.split("gs")
            dtype = {short: full for full, short in DTYPE_SHORT.items()}[dtype]
            fields = (int(hd.removeprefix("hd")), int(k), int(v), int(group))
        except (ValueError, KeyError) as exc:
            raise UnsupportedSpecError(
                f"{name!r} is not a quantize kernel name (expected e.g. "
                f"quantize_rows_cuda_bf16_hd128_k4v4gs32)"
            ) from exc
        return cls(backend, dtype, *fields)

    @property
    def row_layout(self) -> RowLayout:
        return row_layout(self.head_dim, self.itemsize, self.k_bits, self.v_bits, self.group_size)


def define(spec: QuantizeRowsSpec) -> KernelDefinition:
    """The kernel's definition: inputs `keys`, `values` `(N, heads, head_dim)`, output `rows`."""
    return check_definition(
        KernelDefinition(
            name=spec.name,
            backend=spec.backend,
            spec=spec,
            source=render(TEMPLATES, "quantize_rows.jinja", spec),
            header="",
            input_names=("keys", "values"),
            output_names=("rows",),
            threads_per_threadgroup=32,
            threadgroup_bytes=0,
        )
    )


@functools.cache
def build(spec: QuantizeRowsSpec):
    """The `mx.fast` kernel object of `spec`, built once per process."""
    return compile_kernel(define(spec))


def quantize_rows(pages: QuantizedKVPages, keys: mx.array, values: mx.array) -> mx.array:
    """`(N, heads, head_dim)` keys and values as `(N, heads, row_words)` rows of `pages`'
    layout: the kernel on a GPU, `pack_rows` (MLX ops) on the CPU and for latent pages."""
    from mlx_paged.kernels.paged_attention import current_backend

    backend = current_backend()
    # The kernel writes K and V of one size; latent pages' rows (latent, RoPE keys) take
    # MLX's own quantize.
    if backend is None or pages.value_dim:
        return pack_rows(pages, keys, values)
    spec = QuantizeRowsSpec(backend, pages.dtype_name, pages.head_dim, pages.k_bits,
                            pages.v_bits, pages.group_size)  # fmt: skip
    count, heads, _ = keys.shape
    dtype = pages.dtype
    return build(spec)(
        inputs=[keys.astype(dtype), values.astype(dtype)],
        template=[("T", dtype)],
        grid=(count * heads * 32, 1, 1),
        threadgroup=(32, 1, 1),
        output_shapes=[(count, heads, spec.row_layout.row_bytes // 4)],
        output_dtypes=[mx.uint32],
    )[0]


def quantize_rows_specs(backend: str) -> list[QuantizeRowsSpec]:
    """A sample in which each bits pair, group size, quantized head size and dtype appears."""
    pairs = [(8, 8), (4, 4), (8, 4), (4, 8), (16, 4), (8, 16)]
    dims = (64, 128, 256)
    return [
        QuantizeRowsSpec(
            backend,
            DTYPES[i % len(DTYPES)],
            dims[i % len(dims)],
            k,
            v,
            KV_GROUP_SIZES[i // len(pairs)],
        )  # fmt: skip
        for i, (k, v) in enumerate(pairs * 2)
    ]
