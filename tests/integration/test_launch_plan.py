"""Launch plans: one per decode shape, cached, with the grids and shapes the routing implies
(Metal: its kernel objects build on the CPU too)."""

import mlx.core as mx
import pytest

from mlx_paged.codegen.spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention_plan import launch_plan


def _plan(num_seqs, table_blocks, **kw):
    args = dict(backend="metal", dtype=mx.bfloat16, num_seqs=num_seqs, num_heads=32,
                num_queries=1, head_dim=128, block_size=16, num_kv_heads=8,
                table_blocks=table_blocks, sliding_window=False, partition_size=None,
                single_pass=None, variant=None)
    args.update(kw)
    return launch_plan(**args)


def test_split_k_plan_has_partitions_of_the_routed_length():
    plan = _plan(2, 128)  # 2048 tokens of table: four 512-token partitions, two-pass on Metal
    assert plan.name == "paged_decode_metal_bf16_hd128_bs16_g4_p0"
    assert plan.grid == (128 * 8, 2, 4) and plan.threadgroup == (128, 1, 1)
    assert plan.partial_shapes == ((2, 32, 4, 128), (2, 32, 4), (2, 32, 4))
    assert not plan.fused and plan.groups == 16
    assert plan.reduce_kernel is not None and plan.reduce_grid == (32 * 32, 2, 1)


def test_single_pass_plan_when_the_groups_fill_the_gpu():
    plan = _plan(128, 32)  # 1024 (sequence, KV head) groups: single pass
    assert plan.partial_shapes == () and plan.grid == (128 * 8, 128, 1)
    assert plan.reduce_kernel is None


def test_plans_are_cached_per_shape():
    assert _plan(3, 64) is _plan(3, 64)
    assert _plan(3, 64) is not _plan(4, 64)


def test_unservable_shapes_raise():
    with pytest.raises(UnsupportedSpecError, match="not a multiple"):
        _plan(1, 8, num_heads=12)
    with pytest.raises(UnsupportedSpecError, match="one query per row"):
        _plan(1, 8, num_queries=2)
