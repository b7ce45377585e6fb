"""The routing table (`paged_attention_routing.route`): which kernel and partition length a
call gets, as measured on the H200."""

from __future__ import annotations

import mlx.core as mx
import pytest

from mlx_paged.kernels.paged_attention_routing import Route, partition_size_for, route, routed_specs

BF16 = mx.bfloat16


def tc(groups: int, tokens: int) -> Route:
    return route("cuda", BF16, 128, 16, groups, tokens)


@pytest.mark.parametrize(
    "args",
    [
        ("metal", BF16, 128, 16),
        ("cuda", mx.float32, 128, 16),
        ("cuda", BF16, 80, 16),
        ("cuda", BF16, 256, 16),
        ("cuda", BF16, 128, 8),
    ],
)
def test_simt_kernels_serve_where_tensor_cores_are_not_measured(args):
    assert route(*args, 8, 512) == Route("decode_simt", 0)  # one partition
    assert route(*args, 8, 32768) == Route("decode_simt_splitk", 512)
    assert route(*args, 512, 2048) == Route("decode_simt", 0)  # 512 groups, 4 partitions
    assert route(*args, 512, 2560) == Route("decode_simt_splitk", 512)
    assert route(*args, 1024, 32768) == Route("decode_simt", 0)  # the GPU is full


def test_v_heads_of_their_own_size_take_the_simt_kernels():
    # Where the tensor cores would serve K's head size, V heads of 64 go to SIMT.
    assert route("cuda", BF16, 128, 16, 256, 512, value_dim=64) == Route("decode_simt", 0)
    assert route("cuda", BF16, 128, 16, 8, 32768, value_dim=64) == Route("decode_simt_splitk", 512)
    specs = routed_specs("cuda", BF16, 192, 16, 1, False, value_dim=128)
    assert [s.name for s in specs] == [
        "decode_simt_cuda_bf16_hd192_dv128_bs16_g1",
        "decode_simt_splitk_cuda_bf16_hd192_dv128_bs16_g1_p512",
        "decode_reduce_cuda_bf16_hd192_dv128_bs16_g1_p512",
    ]


def test_tensor_core_single_pass_from_40_groups_wide_up_to_72():
    assert tc(32, 8192) == Route("decode_tc_splitk", 1024)
    assert tc(40, 8192) == Route("decode_tc_wide", 0)
    assert tc(72, 8192) == Route("decode_tc_wide", 0)
    assert tc(73, 8192) == Route("decode_tc", 0)
    assert tc(8, 2048) == Route("decode_tc_wide", 0)  # short tables: always one pass
    assert tc(8, 2064) == Route("decode_tc_splitk", 1024)
    assert tc(1, 1024) == Route("decode_tc_wide", 0)  # one partition


def test_tensor_core_split_k_past_16k_loads_straight_to_registers():
    assert tc(8, 16384) == Route("decode_tc_splitk", 1024)
    assert tc(8, 16400) == Route("decode_tc_splitk_direct", 1024)
    # Long tables with a second single-pass wave under three quarters full stay split.
    assert tc(384, 32768) == Route("decode_tc_splitk_direct", 2048)
    assert tc(456, 16400) == Route("decode_tc_splitk_direct", 2048)
    assert tc(464, 32768) == Route("decode_tc", 0)
    assert tc(264, 32768) == Route("decode_tc", 0)
    assert tc(384, 8192) == Route("decode_tc", 0)


@pytest.mark.parametrize(
    "groups,tokens,size",
    [
        (8, 32768, 1024),
        (16, 32768, 2048),
        (32, 32768, 4096),
        (39, 32768, 4096),
        (8, 20480, 1024),
        (8, 65536, 2048),
        (40, 32768, 2048),
        (8, 16384, 1024),
    ],
)
def test_few_groups_on_long_tables_take_the_partitions_closest_to_256_threadgroups(
    groups, tokens, size
):
    assert partition_size_for("decode_tc_splitk_direct", groups, tokens) == size


def test_forced_kernels_get_their_own_partition_lengths():
    assert partition_size_for("decode_simt_splitk", 8, 32768) == 512
    assert partition_size_for("decode_tc_splitk", 8, 8192) == 1024
    assert partition_size_for("decode_tc_splitk", 8, 32768) == 1024  # its only length
    assert partition_size_for("decode_tc", 8, 8192) == 0


def test_routed_specs_are_what_warm_up_compiles():
    cuda = [s.name for s in routed_specs("cuda", BF16, 128, 16, 4, False)]
    assert cuda == [
        "decode_tc_wide_cuda_bf16_hd128_bs16_g4",
        "decode_tc_cuda_bf16_hd128_bs16_g4",
        "decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024",
        "decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p1024",
        "decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p2048",
        "decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p4096",
    ]
    metal = [s.name for s in routed_specs("metal", BF16, 128, 16, 4, True)]
    assert metal == [
        "decode_simt_metal_bf16_hd128_bs16_g4_sw",
        "decode_simt_splitk_metal_bf16_hd128_bs16_g4_p512_sw",
        "decode_reduce_metal_bf16_hd128_bs16_g4_p512_sw",
    ]


def test_quantized_pages_route_to_the_ring_as_16_bit_pages_do_but_never_the_register_path():
    """Quantized pages on tensor-core shapes take the ring kernels where 16-bit pages would, and
    the ring split-K (p1024) where 16-bit pages take the register path past 16k tokens; with a
    16-bit side (which the ring cannot stage) the register-path split-K; the SIMT shapes route
    as on 16-bit pages."""
    q4 = (4, 4, 32)
    cases = {
        (256, 8192): Route("decode_tc", 0),
        (512, 2176): Route("decode_tc", 0),
        (8, 512): Route("decode_tc_wide", 0),
        (8, 8192): Route("decode_tc_splitk", 1024),
        (8, 32768): Route("decode_tc_splitk", 1024),
        (300, 32768): Route("decode_tc_splitk", 1024),
    }
    for (groups, tokens), expected in cases.items():
        assert route("cuda", BF16, 128, 16, groups, tokens, q4) == expected, (groups, tokens)
    direct = Route("decode_tc_splitk_direct", 1024)
    for bits in ((8, 16, 32), (16, 4, 64)):
        assert route("cuda", mx.float16, 128, 32, 256, 8192, bits) == direct
    # Rows of 72 bytes (head dim 64, 4 bits, groups of 64) copy in 8-byte pieces.
    assert route("cuda", mx.float16, 64, 32, 256, 8192, (4, 4, 64)) == Route("decode_tc", 0)
    assert route("cuda", mx.float32, 128, 16, 8, 32768, q4) == Route("decode_simt_splitk", 512)
    assert route("metal", BF16, 128, 16, 1024, 8192, q4) == Route("decode_simt", 0)
    specs = routed_specs("cuda", BF16, 128, 16, 4, False, bits=(8, 4, 32))
    assert [s.name for s in specs] == [
        "decode_tc_wide_cuda_bf16_hd128_bs16_g4_k8v4gs32",
        "decode_tc_cuda_bf16_hd128_bs16_g4_k8v4gs32",
        "decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024_k8v4gs32",
    ]
    specs = routed_specs("cuda", BF16, 128, 16, 4, False, bits=(8, 16, 32))
    assert [s.name for s in specs] == [
        "decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p1024_k8v16gs32"
    ]
    specs = routed_specs("metal", BF16, 128, 16, 4, False, bits=(8, 4, 32))
    assert [s.kernel for s in specs] == ["decode_simt", "decode_simt_splitk", "decode_reduce"]
    assert [(s.k_bits, s.v_bits, s.group_size) for s in specs] == [(8, 4, 32)] * 2 + [(16, 16, 0)]


@pytest.mark.parametrize(
    ("backend", "dtype", "auto", "forced"),
    [
        ("cuda", BF16, "cuda", "cuda"),  # the tensor-core form, timed against the reference
        ("cuda", mx.float32, None, "cuda"),  # the SIMT form only when asked for
        ("metal", BF16, None, "metal"),
    ],
)
def test_latent_decode_takes_the_tensor_core_kernel_under_auto(
    monkeypatch, backend, dtype, auto, forced
):
    from mlx_paged.kernels import paged_attention
    from mlx_paged.kv.kv_layout import KVLayout
    from mlx_paged.runner.attention_setup import select_decode_kernel

    monkeypatch.setattr(paged_attention, "current_backend", lambda: backend)
    layout = KVLayout(num_layers=2, num_kv_heads=1, head_dim=512, dtype=dtype, num_heads=16,
                      query_dtype=dtype, sliding_window=False, value_head_dim=64,
                      latent=True)  # fmt: skip
    assert select_decode_kernel(layout, 16, "auto") == auto
    assert select_decode_kernel(layout, 16, "kernel") == forced
    assert select_decode_kernel(layout, 16, "reference") is None


def test_the_tensor_core_latent_kernel_refuses_score_dims_it_would_drop():
    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kernels.latent_attention import LatentSpec

    LatentSpec("mma", "cuda", "bfloat16", 512, 64, 16)
    LatentSpec("simt", "cuda", "bfloat16", 512, 40, 16)  # SIMT splits any multiple of 8
    with pytest.raises(UnsupportedSpecError, match="RoPE"):
        LatentSpec("mma", "cuda", "bfloat16", 512, 40, 16)  # 552 score dims: 34.5 mma steps


@pytest.mark.parametrize(
    ("batch", "heads", "context", "partition"),
    [
        (32, 16, 32768, 2048),  # 512 threadgroups at 2,048 tokens: the longest partition
        (64, 16, 4096, 512),  # 128 at 2,048 tokens, 256 at 1,024, 512 at 512
        (8, 16, 8192, 128),  # 128 at 512 tokens, 256 at 256, 512 at 128
        (32, 128, 8192, 2048),  # eight head tiles a sequence: 1,024 at 2,048 tokens
        (1, 16, 4096, 64),  # one stream: 64 threadgroups at best, the shortest partition
        (1, 128, 4096, 64),  # 8 tiles x 64 partitions: 512
    ],
)
def test_latent_partitions_shorten_until_the_grid_fills(batch, heads, context, partition):
    from mlx_paged.kernels.latent_attention import partition_for

    assert partition_for(batch, heads, context) == partition


def test_a_latent_spec_names_its_partition_unless_it_is_the_default():
    from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
    from mlx_paged.kernels.latent_attention import LatentSpec

    short = LatentSpec("mma", "cuda", "bfloat16", 512, 64, 16, 128)
    assert short.name == "latent_mma_cuda_bf16_r512_p64_bs16_pt128"
    assert LatentSpec.parse(short.name) == short
    default = LatentSpec.parse("latent_mma_cuda_bf16_r512_p64_bs16")
    assert default.partition_size == 512
    with pytest.raises(UnsupportedSpecError, match="partition 96"):
        LatentSpec("mma", "cuda", "bfloat16", 512, 64, 16, 96)


@pytest.mark.parametrize("scale", [0.0, -0.1, float("nan")])
def test_the_latent_decode_refuses_a_scale_that_is_not_positive(scale):
    """Pass 1 takes the max of the unscaled scores, which only a positive scale preserves."""
    import mlx.core as mx

    from mlx_paged.kernels.latent_attention import latent_attention_decode

    q_latent, q_rope = mx.zeros((1, 16, 1, 512)), mx.zeros((1, 16, 1, 64))
    latent, rope = mx.zeros((2, 16, 1, 512)), mx.zeros((2, 16, 1, 64))
    tables, lens = mx.array([[1]], dtype=mx.int32), mx.array([3], dtype=mx.int32)
    with pytest.raises(ValueError, match="must be positive"):
        latent_attention_decode(q_latent, q_rope, latent, rope, tables, lens, scale=scale,
                                backend="cuda")  # fmt: skip
