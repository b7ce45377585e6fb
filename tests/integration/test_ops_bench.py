"""`bench ops` counts the MLX primitives of one decode step as a GPU builds it (kernels and each
`mx.fast` op one node), here on the CPU; the counts are pinned so that ops cannot creep back into
the step unnoticed. Change a pin only with the change that moves it, and say why."""

from __future__ import annotations

import argparse
import json

import mlx.core as mx

from mlx_paged.bench import ops

# Per layer of the random llama / qwen3 / deepseek_v3 (2 and 4 layers compared): the lean
# decode step (`--lean-decode on`, `models/lean_decode.py`), the fused one's (the default for
# these two, `models/lean_fused.py`) and mlx-lm's forward of one token.
PINNED = {
    "llama": {"ops_per_layer": 21, "ops_per_step": 103, "mlx_lm_ops_per_layer": 50,
              "fused_ops_per_layer": 11, "fused_ops_per_step": 63},
    "qwen3": {"ops_per_layer": 23, "ops_per_step": 111, "mlx_lm_ops_per_layer": 52,
              "fused_ops_per_layer": 11, "fused_ops_per_step": 63},
    "deepseek_v3": {"ops_per_layer": 40, "ops_per_step": 179, "mlx_lm_ops_per_layer": 64},
}  # fmt: skip


def test_decode_step_op_counts_are_pinned(tmp_path):
    out = tmp_path / "ops.json"
    assert ops.main(argparse.Namespace(family=list(PINNED), out=str(out))) == 0
    results = json.loads(out.read_text())["results"]
    for family, pinned in PINNED.items():
        got = {key: results[family][key] for key in pinned}
        assert got == pinned, family
        by_primitive = results[family]["per_layer_by_primitive"]
        # The decode kernel (the MLA one's two passes), RoPE as the node it is on a GPU, and
        # each page write one scatter.
        kernels = 2 if family == "deepseek_v3" else 1
        assert by_primitive["CustomKernel"] == kernels and by_primitive["fast.rope"] == 2
        assert by_primitive["ScatterAxis"] == 2 and "Scatter" not in by_primitive
    # Fused: two add + RMSNorm kernels, qkv_rope, attention (handing back the output
    # projection's rows) and SwiGLU; four matmuls and the two page writes.
    for family in ("llama", "qwen3"):
        fused = results[family]["fused_per_layer_by_primitive"]
        assert fused == {"CustomKernel": 5, "Matmul": 4, "ScatterAxis": 2}


def test_fast_ops_count_as_one_node_each():
    x, w = mx.ones((2, 8)), mx.ones((8,))
    mx.eval(x, w)
    with ops.FastOpsAsOne() as fast:
        y = mx.fast.rms_norm(x, w, 1e-5) * 2
    nodes = ops.count_nodes(y)
    nodes.subtract(fast.fallback)
    assert +(nodes + fast.calls) == {"fast.rms_norm": 1, "Multiply": 1, "Broadcast": 1}
    assert mx.fast.rms_norm is fast._saved["rms_norm"]  # restored on exit
