"""MLX's CUDA graph budget, set for serving before MLX's first GPU work.

MLX's CUDA backend records kernels into a CUDA graph and launches it once the graph holds
100 ops or its kernels' inputs sum past `MLX_MAX_MB_PER_BUFFER` (1,000 on H100/H200, counted
in 2**20 elements, a whole array at every use). A KV page array of hundreds of MB is an input
of each page write and attention call, so with that budget a decode step launches a graph at
nearly every layer instead of one per 100 ops.
"""

from __future__ import annotations

import os

INPUT_BUDGET_ENV = "MLX_MAX_MB_PER_BUFFER"
# Past any step's inputs: graphs then end by their op count alone.
LIFTED_INPUT_BUDGET = 1 << 30


def lift_graph_input_budget() -> bool:
    """On MLX's CUDA backend, raise the graph input budget unless the user set it; True when
    raised. MLX reads it once, when a stream first runs GPU work, so this is called on import
    of `mlx_paged`; a process that ran GPU work before keeps MLX's budget."""
    if INPUT_BUDGET_ENV in os.environ:
        return False
    import mlx.core as mx

    if not (hasattr(mx, "cuda") and mx.cuda.is_available()):
        return False
    os.environ[INPUT_BUDGET_ENV] = str(LIFTED_INPUT_BUDGET)
    return True
