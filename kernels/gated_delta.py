"""The Gated DeltaNet recurrence (Qwen3.5, Qwen3-Next, OLMo hybrid) as one generated kernel
(`gated_delta.jinja`, Metal and CUDA from the one template).

mlx-lm runs the recurrence as its own Metal kernel on Apple GPUs and, everywhere else, as a
loop of MLX ops over the timesteps: on CUDA a prompt of n tokens then costs n small steps per
layer, each paying MLX's host time per op. This kernel walks the timesteps on the GPU instead,
so a hybrid's prefill costs a launch per layer rather than per token.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from mlx_paged.codegen.build import KernelDefinition, check_definition, compile_kernel
from mlx_paged.codegen.environment import render
from mlx_paged.kernels.kernel_spec import DTYPE_SHORT, DTYPES, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_routing import dtype_name

TEMPLATES = Path(__file__).resolve().parent
ROWS_PER_THREADGROUP = 4  # value rows, one simdgroup each
_NAME = re.compile(r"gated_delta_([a-z]+)_([a-z0-9]+)_hk(\d+)_hv(\d+)_dk(\d+)_dv(\d+)")


@dataclass(frozen=True)
class GatedDeltaSpec:
    """The recurrence kernel of one layer shape (heads and head sizes), on one backend; `dtype`
    is that of q, k, v, beta and the output (g and the state are fp32)."""

    backend: str
    dtype: str
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int

    def __post_init__(self):
        problems = []
        if self.dtype not in DTYPES:
            problems.append(f"dtype {self.dtype}")
        if self.key_dim % 32 or not 32 <= self.key_dim <= 256:
            problems.append(f"key head size {self.key_dim} (a multiple of 32 up to 256)")
        if self.value_dim % ROWS_PER_THREADGROUP:
            problems.append(f"value head size {self.value_dim} (a multiple of 4)")
        if self.key_heads < 1 or self.value_heads % self.key_heads:
            problems.append(f"{self.value_heads} value heads over {self.key_heads} key heads")
        if problems:
            raise UnsupportedSpecError(f"no gated-delta kernel for {', '.join(problems)}")

    @property
    def name(self) -> str:
        return (
            f"gated_delta_{self.backend}_{DTYPE_SHORT[self.dtype]}_hk{self.key_heads}"
            f"_hv{self.value_heads}_dk{self.key_dim}_dv{self.value_dim}"
        )

    @classmethod
    def parse(cls, name: str) -> GatedDeltaSpec:
        """Inverse of `name` (e.g. `gated_delta_cuda_bf16_hk16_hv32_dk128_dv128`)."""
        match = _NAME.fullmatch(name)
        dtypes = {short: full for full, short in DTYPE_SHORT.items()}
        if match is None or match[2] not in dtypes:
            raise UnsupportedSpecError(
                f"{name!r} is not a gated-delta kernel name (expected e.g. "
                f"gated_delta_cuda_bf16_hk16_hv32_dk128_dv128)"
            )
        return cls(match[1], dtypes[match[2]], *(int(match[i]) for i in range(3, 7)))

    @property
    def rows_per_threadgroup(self) -> int:
        return ROWS_PER_THREADGROUP


def define(spec: GatedDeltaSpec) -> KernelDefinition:
    """Inputs q, k `(B, T, Hk, Dk)`, v `(B, T, Hv, Dv)`, g and beta `(B, T, Hv)`, state
    `(B, Hv, Dv, Dk)`; outputs y `(B, T, Hv, Dv)` and the state after the last step."""
    return check_definition(
        KernelDefinition(
            name=spec.name,
            backend=spec.backend,
            spec=spec,
            source=render(TEMPLATES, "gated_delta.jinja", spec),
            header="",
            input_names=("q", "k", "v", "g", "beta", "state"),
            output_names=("y", "state_out"),
            threads_per_threadgroup=32 * ROWS_PER_THREADGROUP,
            threadgroup_bytes=0,
        )
    )


@functools.cache
def build(spec: GatedDeltaSpec):
    """The `mx.fast` kernel object of `spec`, built once per process."""
    return compile_kernel(define(spec))


def spec_for(backend: str, q: mx.array, v: mx.array) -> GatedDeltaSpec:
    """The spec of a call with these q and v (raises `UnsupportedSpecError` if none)."""
    return GatedDeltaSpec(
        backend, dtype_name(q.dtype), q.shape[2], v.shape[2], q.shape[3], v.shape[3]
    )


def gated_delta(spec: GatedDeltaSpec, q, k, v, g, beta, state) -> tuple[mx.array, mx.array]:
    """y and the new state of the recurrence over `q.shape[1]` timesteps (shapes: `define`);
    mlx-lm's `gated_delta_ops` computes the same with a scalar gate and no mask."""
    batch, steps = q.shape[:2]
    dtype = q.dtype
    return build(spec)(
        inputs=[
            q,
            k.astype(dtype),
            v.astype(dtype),
            g.astype(mx.float32),
            beta.astype(dtype),
            state.astype(mx.float32),
        ],
        template=[("T", dtype)],
        grid=(spec.value_dim * 32, batch * spec.value_heads, 1),
        threadgroup=(32 * ROWS_PER_THREADGROUP, 1, 1),
        output_shapes=[(batch, steps, spec.value_heads, spec.value_dim), state.shape],
        output_dtypes=[dtype, mx.float32],
    )


def gated_delta_specs(backend: str) -> list[GatedDeltaSpec]:
    """A sample in which each dtype, a shared key head, and the key sizes 64 to 256 appear
    (Qwen3.5 and Qwen3-Next: 16 key heads, 32 or 64 value heads, 128 by 128)."""
    return [
        GatedDeltaSpec(backend, "bfloat16", 16, 32, 128, 128),
        GatedDeltaSpec(backend, "float16", 16, 16, 128, 128),
        GatedDeltaSpec(backend, "float32", 2, 4, 64, 32),
        GatedDeltaSpec(backend, "bfloat16", 4, 4, 256, 128),
    ]
