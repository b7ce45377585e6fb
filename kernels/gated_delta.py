"""The Gated DeltaNet recurrence (Qwen3.5, Qwen3-Next, OLMo hybrid) as generated kernels,
Metal and CUDA from one template each.

mlx-lm runs the recurrence as its own Metal kernel on Apple GPUs and, everywhere else, as a
loop of MLX ops over the timesteps: on CUDA a prompt of n tokens then costs n small steps per
layer, each paying MLX's host time per op. `gated_delta.jinja` walks the timesteps on the GPU
instead, so a hybrid's prefill costs a launch per layer rather than per token. At decode,
`gated_delta_step.jinja` (a spec with a `conv_size`) also takes over the dozen ops around the
recurrence (the causal conv, the q/k norms, the gates), since host time per op bounds the step.
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
STEP_INPUTS = ("qkv", "conv_state", "conv_weight", "a", "b", "a_log", "dt_bias", "state")
STEP_OUTPUTS = ("y", "state_out", "conv_out")
_NAME = re.compile(
    r"gated_delta(_step)?_([a-z]+)_([a-z0-9]+)_hk(\d+)_hv(\d+)_dk(\d+)_dv(\d+)(?:_conv(\d+))?"
)


@dataclass(frozen=True)
class GatedDeltaSpec:
    """The recurrence kernel of one layer shape (heads and head sizes), on one backend; `dtype`
    is that of q, k, v, beta and the output (g and the state are fp32). With a `conv_size`,
    the whole decode step of a Qwen3.5 layer from its projections (`gated_delta_step.jinja`),
    whose causal conv spans that many tokens."""

    backend: str
    dtype: str
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    conv_size: int = 0

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
        if self.conv_size and not 2 <= self.conv_size <= 8:
            problems.append(f"conv size {self.conv_size} (2 to 8)")
        if problems:
            raise UnsupportedSpecError(f"no gated-delta kernel for {', '.join(problems)}")

    @property
    def name(self) -> str:
        step, conv = ("_step", f"_conv{self.conv_size}") if self.conv_size else ("", "")
        return (
            f"gated_delta{step}_{self.backend}_{DTYPE_SHORT[self.dtype]}_hk{self.key_heads}"
            f"_hv{self.value_heads}_dk{self.key_dim}_dv{self.value_dim}{conv}"
        )

    @classmethod
    def parse(cls, name: str) -> GatedDeltaSpec:
        """Inverse of `name` (e.g. `gated_delta_cuda_bf16_hk16_hv32_dk128_dv128`, or
        `gated_delta_step_cuda_bf16_hk16_hv32_dk128_dv128_conv4`)."""
        match = _NAME.fullmatch(name)
        dtypes = {short: full for full, short in DTYPE_SHORT.items()}
        if match is None or match[3] not in dtypes or bool(match[1]) != bool(match[8]):
            raise UnsupportedSpecError(
                f"{name!r} is not a gated-delta kernel name (expected e.g. "
                f"gated_delta_cuda_bf16_hk16_hv32_dk128_dv128 or "
                f"gated_delta_step_cuda_bf16_hk16_hv32_dk128_dv128_conv4)"
            )
        sizes = (int(match[i]) for i in range(4, 8))
        return cls(match[2], dtypes[match[3]], *sizes, int(match[8] or 0))

    @property
    def rows_per_threadgroup(self) -> int:
        return ROWS_PER_THREADGROUP


def define(spec: GatedDeltaSpec) -> KernelDefinition:
    """The recurrence: inputs q, k `(B, T, Hk, Dk)`, v `(B, T, Hv, Dv)`, g and beta
    `(B, T, Hv)`, state `(B, Hv, Dv, Dk)`; outputs y `(B, T, Hv, Dv)` and the state after the
    last step. The decode step (`conv_size`): inputs qkv `(B, 1, 2 Hk Dk + Hv Dv)`, conv_state
    `(B, conv_size - 1, channels)`, conv_weight `(channels, conv_size, 1)`, a and b
    `(B, 1, Hv)`, a_log (fp32) and dt_bias `(Hv,)`, state; outputs y, the state and the next
    conv state."""
    if spec.conv_size:
        template, names = "gated_delta_step.jinja", (STEP_INPUTS, STEP_OUTPUTS)
    else:
        template, names = (
            "gated_delta.jinja",
            (("q", "k", "v", "g", "beta", "state"), ("y", "state_out")),
        )
    return check_definition(
        KernelDefinition(
            name=spec.name,
            backend=spec.backend,
            spec=spec,
            source=render(TEMPLATES, template, spec),
            header="",
            input_names=names[0],
            output_names=names[1],
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


def gated_delta_step(
    spec: GatedDeltaSpec, qkv, conv_state, conv_weight, a, b, a_log, dt_bias, state
):
    """y `(B, 1, Hv, Dv)`, the state and the conv state after one decode step of a Qwen3.5
    Gated DeltaNet layer (shapes: `define`); what mlx-lm's layer computes between its input
    projections and its gated norm. Every input but a_log and the state has `spec.dtype` (a
    and b are cast to it)."""
    batch = qkv.shape[0]
    return build(spec)(
        inputs=[
            qkv,
            conv_state,
            conv_weight,
            a.astype(qkv.dtype),
            b.astype(qkv.dtype),
            a_log.astype(mx.float32),
            dt_bias,
            state.astype(mx.float32),
        ],
        template=[("T", qkv.dtype)],
        grid=(spec.value_dim * 32, batch * spec.value_heads, 1),
        threadgroup=(32 * ROWS_PER_THREADGROUP, 1, 1),
        output_shapes=[(batch, 1, spec.value_heads, spec.value_dim), state.shape, conv_state.shape],
        output_dtypes=[qkv.dtype, mx.float32, qkv.dtype],
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


def gated_delta_step_specs(backend: str) -> list[GatedDeltaSpec]:
    """The decode step's sample: Qwen3.5's shapes in each 16-bit dtype, and a small fp32 one."""
    return [
        GatedDeltaSpec(backend, "bfloat16", 16, 16, 128, 128, 4),
        GatedDeltaSpec(backend, "float16", 16, 32, 128, 128, 4),
        GatedDeltaSpec(backend, "float32", 2, 4, 64, 32, 3),
    ]
