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


@pytest.fixture
def cuda_plans(monkeypatch):
    """CUDA launch plans on this CPU machine: the real routing, rendering and grids, with a
    stand-in for the one step that needs a CUDA device (building the `cuda_kernel` object)."""
    import mlx_paged.kernels.paged_attention_plan as plan_module
    monkeypatch.setattr(plan_module, "build", lambda spec: spec)
    launch_plan.cache_clear()
    yield lambda num_seqs, table_blocks: _plan(num_seqs, table_blocks, backend="cuda")
    launch_plan.cache_clear()


def test_cuda_routing_single_pass_from_40_groups_wide_up_to_72(cuda_plans):
    prefix = "paged_decode_cuda_bf16_hd128_bs16_g4_"
    # 8 sequences x 8 KV heads at 32k tokens: one pass of 8 simdgroups (256 threads).
    plan = cuda_plans(8, 2048)
    assert plan.kernel.name == prefix + "p0_mma_s3_w8" and plan.partial_shapes == ()
    assert plan.grid == (256 * 8, 8, 1) and plan.threadgroup == (256, 1, 1) and not plan.fused
    assert cuda_plans(5, 512).kernel.name == prefix + "p0_mma_s3_w8"  # 40 groups at 8k
    assert cuda_plans(9, 512).kernel.name == prefix + "p0_mma_s3_w8"  # 72
    # From 80 groups the single pass keeps 4 simdgroups.
    plan = cuda_plans(10, 512)
    assert plan.kernel.name == prefix + "p0_mma_s3" and plan.grid == (128 * 8, 10, 1)
    assert cuda_plans(64, 128).kernel.name == prefix + "p0_mma_s3"  # 512 groups at 2k
    # Tables of up to 2048 tokens: one pass at any count.
    assert cuda_plans(1, 128).kernel.name == prefix + "p0_mma_s3_w8"
    # 4 sequences (32 groups) at 8k: the fused split-K of 1024-token partitions.
    plan = cuda_plans(4, 512)
    assert plan.kernel.name == prefix + "p1024_mma_s3_fused"
    assert plan.fused and plan.grid == (128 * 8, 4, 8)
    assert plan.partial_shapes == ((4, 32, 8, 128), (4, 32, 8), (4, 32, 8))
    # 48 sequences (384 groups) past 16k tokens: split-K, 2048-token partitions of mma_u2.
    plan = cuda_plans(48, 2048)
    assert plan.kernel.name == prefix + "p2048_mma_u2_fused"
    assert plan.grid[2] == 16


def test_cuda_few_groups_on_long_tables_aim_at_256_threadgroups(cuda_plans):
    prefix = "paged_decode_cuda_bf16_hd128_bs16_g4_"
    # 1, 2 and 4 sequences of 8 KV heads at 32k tokens: 256 threadgroups of mma_u2 each.
    for seqs, size in ((1, 1024), (2, 2048), (4, 4096)):
        plan = cuda_plans(seqs, 2048)
        assert plan.kernel.name == prefix + f"p{size}_mma_u2_fused"
        assert plan.fused and plan.grid == (128 * 8, seqs, 32768 // size)
        assert plan.partial_shapes[1] == (seqs, 32, 32768 // size)
