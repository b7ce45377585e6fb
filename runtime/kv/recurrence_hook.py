"""Route mlx-lm's Gated DeltaNet recurrence to the generated kernel inside paged forwards.

mlx-lm's `gated_delta_update` runs its own Metal kernel on Apple GPUs and otherwise calls
`gated_delta_ops`, a loop of MLX ops over the timesteps, through its module's global name. The
hook replaces that name: during a paged forward (`forward_on`) whose pool has a
`recurrence_backend` (a GPU, unless `--paged-attention reference`), the calls the kernel
serves (a scalar gate, no padding mask) run `kernels/gated_delta`; every other call, and every
call outside the paged runner (mlx-lm's own generation among them), runs mlx-lm's function.
"""

from __future__ import annotations

import mlx_lm.models.gated_delta as mlx_gated_delta

from mlx_paged.kernels.gated_delta import gated_delta, spec_for
from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kv.attention_hook import active_pool

_original = mlx_gated_delta.gated_delta_ops


def install_recurrence_hook() -> bool:
    """Replace mlx-lm's recurrence loop by `gated_delta_ops` below; True if it was replaced."""
    if mlx_gated_delta.gated_delta_ops is not _original:
        return False
    mlx_gated_delta.gated_delta_ops = gated_delta_ops
    return True


def gated_delta_ops(q, k, v, g, beta, state=None, mask=None):
    """mlx-lm's `gated_delta_ops`, on the generated kernel where a paged forward calls it."""
    pool = active_pool()
    backend = pool.recurrence_backend if pool is not None else None
    if backend is None or mask is not None or state is None or g.ndim != 3:
        return _original(q, k, v, g, beta, state, mask)
    try:
        spec = spec_for(backend, q, v)
    except UnsupportedSpecError:
        return _original(q, k, v, g, beta, state, mask)
    pool.attention_calls["gated_delta_kernel", "decode" if q.shape[1] == 1 else "prefill"] += 1
    return gated_delta(spec, q, k, v, g, beta, state)
