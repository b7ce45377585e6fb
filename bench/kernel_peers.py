"""The kernel benchmark's peers on the same K/V made contiguous: MLX's SDPA and PyTorch's."""

from __future__ import annotations

import mlx.core as mx

from .problems import contiguous_kv
from .timing import time_torch, to_torch


def time_peers(problem, context: int, args, torch_ok: bool, timed, row: dict,
               outputs: dict) -> None:  # fmt: skip
    """Time MLX's SDPA (unless `--skip mlx_sdpa`) and, with `torch_ok`, PyTorch's SDPA into
    `row["us"]`, and keep their outputs in `outputs`."""
    mlx_ok = "mlx_sdpa" not in set(getattr(args, "skip", []))
    if not (mlx_ok or torch_ok):
        return  # no contiguous peer asked for: skip the copy
    k, v = contiguous_kv(problem.k_pages, problem.v_pages, problem.tables, context)
    if mlx_ok:

        def sdpa(queries):
            return mx.fast.scaled_dot_product_attention(queries, k, v, scale=problem.scale)

        outputs["mlx_sdpa"] = sdpa(problem.q)
        row["us"]["mlx_sdpa"] = timed(sdpa, problem.q)
    if torch_ok:
        outputs["torch_sdpa"], row["us"]["torch_sdpa"] = _time_torch_sdpa(problem, k, v, args)


def _time_torch_sdpa(problem, k, v, args) -> tuple[mx.array, float]:
    import torch
    import torch.nn.functional as F

    tq, tk, tv = to_torch(problem.q), to_torch(k), to_torch(v)
    gqa = args.num_heads != args.num_kv_heads

    def call():
        return F.scaled_dot_product_attention(tq, tk, tv, scale=problem.scale, enable_gqa=gqa)

    out = call()
    torch.cuda.synchronize()
    return mx.array(out.float().cpu().numpy()), time_torch(call) * 1e6
