"""Route mlx-lm's Gated DeltaNet recurrence to the generated kernels inside paged forwards.

mlx-lm's `gated_delta_update` runs its own Metal kernel on Apple GPUs and otherwise calls
`gated_delta_ops`, a loop of MLX ops over the timesteps, through its module's global name. The
hook replaces that name: during a paged forward (`forward_on`) whose pool has a
`recurrence_backend` (a GPU, unless `--paged-attention reference`), the calls the kernel
serves (a scalar gate, no padding mask) run `kernels/gated_delta`; every other call, and every
call outside the paged runner (mlx-lm's own generation among them), runs mlx-lm's function.

A decode step of a Qwen3.5 layer goes further: the hook also replaces the layer's `__call__`,
and there its dozen ops from the input projections to the gated norm run as one
`gated_delta_step` kernel, since a decode step's time is host time per op; its four input
projections run as one matmul where `fuse_input_projections` stacked them.
"""

from __future__ import annotations

import mlx_lm.models.gated_delta as mlx_gated_delta
import mlx_lm.models.qwen3_5 as mlx_qwen3_5

from mlx_paged.kernels.gated_delta import GatedDeltaSpec, gated_delta, gated_delta_step, spec_for
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention_routing import dtype_name
from mlx_paged.kv.attention_hook import active_pool
from mlx_paged.models.fused_projections import fuse_projections

_original = mlx_gated_delta.gated_delta_ops
_original_layer_call = mlx_qwen3_5.GatedDeltaNet.__call__


def install_recurrence_hook() -> bool:
    """Replace mlx-lm's recurrence loop by `gated_delta_ops` below, and Qwen3.5's layer call by
    `gated_delta_layer`; True if they were replaced."""
    if mlx_gated_delta.gated_delta_ops is not _original:
        return False
    mlx_gated_delta.gated_delta_ops = gated_delta_ops
    mlx_qwen3_5.GatedDeltaNet.__call__ = gated_delta_layer
    return True


def gated_delta_layer(self, inputs, mask=None, cache=None):
    """mlx-lm's Qwen3.5 `GatedDeltaNet.__call__`, with a paged decode step in one kernel."""
    spec = _decode_step_spec(self, inputs, mask, cache)
    if spec is None:
        return _original_layer_call(self, inputs, mask, cache)
    active_pool().attention_calls["gated_delta_step_kernel", "decode"] += 1
    batch, steps, _ = inputs.shape
    fused = self.__dict__.get("_fused_inputs")
    if fused is not None:  # the kernel reads qkv, b and a where the one matmul wrote them
        qkv, z, b, a = fused(inputs)
    else:
        qkv, z = self.in_proj_qkv(inputs), self.in_proj_z(inputs)
        b, a = self.in_proj_b(inputs), self.in_proj_a(inputs)
    z = z.reshape(batch, steps, self.num_v_heads, self.head_v_dim)
    y, cache[1], cache[0] = gated_delta_step(
        spec, qkv, cache[0], self.conv1d.weight, a, b, self.A_log, self.dt_bias, cache[1]
    )
    cache.advance(steps)
    return self.out_proj(self.norm(y, z).reshape(batch, steps, -1))


def fuse_input_projections(model) -> int:
    """Stack the four input projections of each Qwen3.5 Gated DeltaNet layer of `model` into
    one (`fuse_projections`), for its decode step; returns how many layers were fused."""
    fused = 0
    for _, layer in model.named_modules():
        if isinstance(layer, mlx_qwen3_5.GatedDeltaNet):
            names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
            projections = fuse_projections([layer[n] for n in names])
            if projections is not None:
                object.__setattr__(layer, "_fused_inputs", projections)
                fused += 1
    return fused


def _decode_step_spec(layer, inputs, mask, cache) -> GatedDeltaSpec | None:
    """The decode-step kernel for this call, or None where mlx-lm's own call must run: outside
    a paged forward with a recurrence backend, past one token, with a mask, padding, a fresh
    state, sharding, a conv bias, or parameters of another dtype than the activations."""
    backend = _recurrence_backend()
    if (
        backend is None
        or inputs.shape[1] != 1
        or mask is not None
        or cache is None
        or cache[0] is None
        or cache[1] is None
        or cache.lengths is not None
        or layer.sharding_group is not None
        or "bias" in layer.conv1d
    ):
        return None
    dtype = inputs.dtype
    if any(p.dtype != dtype for p in (cache[0], layer.conv1d.weight, layer.dt_bias)):
        return None
    try:
        return GatedDeltaSpec(
            backend, dtype_name(dtype), layer.num_k_heads, layer.num_v_heads,
            layer.head_k_dim, layer.head_v_dim, layer.conv_kernel_size,
        )  # fmt: skip
    except UnsupportedSpecError:
        return None


def gated_delta_ops(q, k, v, g, beta, state=None, mask=None):
    """mlx-lm's `gated_delta_ops`, on the generated kernel where a paged forward calls it."""
    backend = _recurrence_backend()
    if backend is None or mask is not None or state is None or g.ndim != 3:
        return _original(q, k, v, g, beta, state, mask)
    try:
        spec = spec_for(backend, q, v)
    except UnsupportedSpecError:
        return _original(q, k, v, g, beta, state, mask)
    phase = "decode" if q.shape[1] == 1 else "prefill"
    active_pool().attention_calls["gated_delta_kernel", phase] += 1
    return gated_delta(spec, q, k, v, g, beta, state)


def _recurrence_backend() -> str | None:
    """The running paged forward's recurrence backend; None outside one or without kernels."""
    pool = active_pool()
    return pool.recurrence_backend if pool is not None else None
