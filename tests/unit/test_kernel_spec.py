"""KernelSpec names and limits, the pass-1 geometry, and the render-time checks (pure Python +
Jinja)."""

from __future__ import annotations

import dataclasses

import pytest

from mlx_paged.codegen.build import (
    KernelDefinition,
    KernelRenderError,
    check_definition,
    cuda_dynamic_shared,
)
from mlx_paged.kernels.catalog import (
    all_specs,
    representative_specs,
    score_rule_specs,
    value_dim_specs,
)
from mlx_paged.kernels.kernel_spec import KERNELS, KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_geometry import Geometry, define, geometry

METAL_ATTRIBUTES = (
    "threadgroup_position_in_grid",
    "threadgroups_per_grid",
    "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup",
    "thread_index_in_threadgroup",
)


def test_names_say_kernel_and_shape_and_parse_back():
    spec = KernelSpec("decode_simt", "metal", "bfloat16", 128, 16, 4)
    assert spec.name == "decode_simt_metal_bf16_hd128_bs16_g4"
    split = KernelSpec("decode_tc_splitk", "cuda", "float16", 64, 32, 8, 1024, True)
    assert split.name == "decode_tc_splitk_cuda_f16_hd64_bs32_g8_p1024_sw"
    for backend in ("metal", "cuda"):
        for s in all_specs(backend) + value_dim_specs(backend) + score_rule_specs(backend):
            assert KernelSpec.parse(s.name) == s
    mla = KernelSpec("decode_simt", "cuda", "bfloat16", 192, 16, 1, value_dim=128)
    assert mla.name == "decode_simt_cuda_bf16_hd192_dv128_bs16_g1" and mla.v_dim == 128


def test_the_catalog_is_the_routed_kernels_at_every_shape():
    metal, cuda = all_specs("metal"), all_specs("cuda")
    # 3 SIMT kernels (and the RoPE forms of the two pass-1 ones) x 3 dtypes x 7 head sizes x
    # 3 blocks x 8 groups x 2 window flags ...
    assert len(metal) == (3 + 2) * 3 * 7 * 3 * 8 * 2
    assert {s.kernel for s in metal} == {"decode_simt", "decode_simt_splitk", "decode_reduce"}
    assert sum(s.rope for s in metal) == 2 * 3 * 7 * 3 * 8 * 2
    # ... and on CUDA the tensor-core kernels (6 specs: the direct split-K at 3 lengths, each
    # with and without RoPE) at bf16/fp16, head_dim 64/128, blocks of 16/32.
    assert len(cuda) == len(metal) + 2 * 6 * 2 * 2 * 2 * 8 * 2
    assert {s.kernel for s in cuda} == set(KERNELS)
    assert {s.name.split("_cuda")[0] for s in cuda if s.rope} == {
        k.replace("decode_", "decode_rope_") for k in KERNELS if k != "decode_reduce"
    }


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(head_dim=48), "head_dim=48"),
        (dict(block_size=64), "block_size=64"),
        (dict(gqa=9), "gqa=9"),
        (dict(dtype="int8"), "dtype='int8'"),
        (dict(backend="vulkan"), "backend='vulkan'"),
        (dict(partition_size=512), "single pass and takes no partition size"),
        (dict(kernel="decode_simt_splitk"), "partitions of 512 tokens"),
        (dict(kernel="decode_tc"), "tensor-core kernels are CUDA only"),
        (dict(kernel="decode_tc", backend="cuda", dtype="float32"), "bf16/fp16"),
        (dict(kernel="decode_tc", backend="cuda", block_size=8), "16-token sub-pages"),
        (dict(kernel="decode_tc", backend="cuda", head_dim=96), "head_dim 64 and 128"),
        (dict(value_dim=128), "only where it differs"),
        (dict(value_dim=100), "V head sizes are"),
        (dict(value_dim=64, kernel="decode_tc", backend="cuda"), "tensor-core kernels take K"),
        (dict(value_dim=64, k_bits=8, v_bits=8, group_size=32), "quantized pages take K"),
    ],
)
def test_unsupported_specs_raise_naming_the_spec(kwargs, message):
    args = (
        dict(
            kernel="decode_simt",
            backend="metal",
            dtype="bfloat16",
            head_dim=128,
            block_size=16,
            gqa=4,
        )
        | kwargs
    )
    with pytest.raises(UnsupportedSpecError, match=message) as info:
        KernelSpec(**args)
    assert args["kernel"] in str(info.value)


def test_unknown_kernels_and_garbage_names_are_refused():
    with pytest.raises(UnsupportedSpecError, match="is not a kernel"):
        KernelSpec("decode_fast", "cuda", "bfloat16", 128)
    for name in (
        "paged_decode_metal_bf16_hd128_bs16_g4_p0",
        "decode_simt_metal_bf16_hd128",
        "decode_simt_metal_bf16_hd128_bs16_g4_q7",
        "decode_simt_metal_xx_hd128_bs16_g4",
    ):
        with pytest.raises(UnsupportedSpecError):
            KernelSpec.parse(name)


@pytest.mark.parametrize(
    "dtype,hd,bs,g,expected",
    [
        (
            "bfloat16",
            128,
            16,
            4,
            Geometry(
                nsg=4, tpr=16, epl=8, chunk=8, vector_loads=True, stages=1, stage_rows=0, epl_v=8
            ),
        ),
        (
            "bfloat16",
            128,
            16,
            8,
            Geometry(
                nsg=4, tpr=16, epl=8, chunk=4, vector_loads=True, stages=1, stage_rows=0, epl_v=8
            ),
        ),
        (
            "float32",
            128,
            16,
            4,
            Geometry(
                nsg=4, tpr=32, epl=4, chunk=8, vector_loads=True, stages=1, stage_rows=0, epl_v=4
            ),
        ),
        (
            "bfloat16",
            80,
            8,
            3,
            Geometry(
                nsg=4, tpr=8, epl=10, chunk=2, vector_loads=False, stages=1, stage_rows=0, epl_v=10
            ),
        ),
        (
            "float32",
            96,
            32,
            1,
            Geometry(
                nsg=4, tpr=16, epl=6, chunk=16, vector_loads=False, stages=1, stage_rows=0, epl_v=6
            ),
        ),
        # 4 simdgroups x 8 heads x 256 dims of fp32 would need 33 KB: halved to 2 simdgroups.
        (
            "bfloat16",
            256,
            16,
            8,
            Geometry(
                nsg=2, tpr=32, epl=8, chunk=4, vector_loads=True, stages=1, stage_rows=0, epl_v=8
            ),
        ),
    ],
)
def test_simt_geometry(dtype, hd, bs, g, expected):
    assert geometry(KernelSpec("decode_simt", "cuda", dtype, hd, bs, g)) == expected


def test_value_heads_of_their_own_size_split_both_rows_into_whole_vectors():
    # K 192 / V 128 in bf16: 16 lanes a row hold 12 and 8 values (K's 24 bytes load element
    # by element); K 64 / V 128: 8 lanes, 8 and 16 values, whole 16-byte vectors.
    spec = KernelSpec("decode_simt", "cuda", "bfloat16", 192, 16, 4, value_dim=128)
    geo = geometry(spec)
    assert (geo.tpr, geo.epl, geo.epl_v, geo.vector_loads) == (16, 12, 8, False)
    wide_v = geometry(dataclasses.replace(spec, head_dim=64))
    assert (wide_v.tpr, wide_v.epl, wide_v.epl_v, wide_v.vector_loads) == (8, 8, 16, True)
    # The merge buffer and the outputs are V's size.
    assert define(spec).threadgroup_bytes == 4 * geo.nsg * 4 * (128 + 2)
    source = define(spec).source
    assert "constexpr int VALUE_DIM = 128;" in source and "constexpr int EPL_V = 8;" in source
    with pytest.raises(UnsupportedSpecError, match="RoPE kernels take K and V of one head size"):
        dataclasses.replace(spec, rope=True)
    reduce = KernelSpec("decode_reduce", "cuda", "bfloat16", 192, 16, 4, 512, value_dim=128)
    assert "constexpr int VALUE_DIM = 128;" in define(reduce).source


def test_tensor_core_kernels_geometry_and_ring():
    tc = define(KernelSpec.parse("decode_tc_cuda_bf16_hd128_bs16_g4"))
    wide = define(KernelSpec.parse("decode_tc_wide_cuda_bf16_hd128_bs16_g4"))
    direct = define(KernelSpec.parse("decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p2048"))
    # 4 (8) simdgroups x 3 slots x (16 rows of K + 16 of V) x 128 dims x 2 bytes, dynamic.
    assert (tc.threads_per_threadgroup, tc.ring_bytes) == (128, 4 * 3 * 2 * 16 * 128 * 2)
    assert (wide.threads_per_threadgroup, wide.ring_bytes) == (256, 8 * 3 * 2 * 16 * 128 * 2)
    assert "mlx_paged_ldsm_x4_trans(" in tc.source and "(mm_c ^ (r & 7))" in tc.source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in tc.header
    # The direct split-K loads two sub-pages into registers a step, and has no ring.
    assert direct.ring_bytes == 0 and "ldmatrix" not in direct.header
    assert "constexpr int U = 2;" in direct.source and "T kr[U][2][KQ];" in direct.source
    geo = geometry(KernelSpec.parse("decode_tc_splitk_cuda_f16_hd64_bs32_g8_p1024"))
    assert (geo.tensor_cores, geo.stages, geo.stage_rows, geo.mma_k_width) == (True, 3, 16, 16)


def test_split_kernels_write_partials_and_the_fused_one_merges():
    two_pass = define(KernelSpec.parse("decode_simt_splitk_metal_bf16_hd128_bs16_g4_p512"))
    assert two_pass.output_names == ("partial_out", "partial_max", "partial_sum")
    assert "constexpr int PARTITION = 512;" in two_pass.source
    fused = define(KernelSpec.parse("decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024"))
    assert fused.output_names == ("out", "partials", "counters_next")
    assert fused.input_names[-1] == "counters" and "atomicAdd(fr_counter, 1)" in fused.source
    # The launch appends the counters after every other input; quantized pages are one input.
    quantized = define(
        KernelSpec.parse("decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p1024_k4v8gs32")
    )
    assert quantized.input_names == (
        "queries", "kv_pages", "block_tables", "seq_lens", "scale", "counters"
    )  # fmt: skip
    reduce = define(KernelSpec.parse("decode_reduce_cuda_bf16_hd128_bs16_g4_p512_sw"))
    assert reduce.input_names == ("partial_out", "partial_max", "partial_sum", "seq_lens", "window")


def test_cuda_ring_beside_static_memory_asks_mlx_to_raise_the_limit():
    ring = define(KernelSpec.parse("decode_tc_cuda_bf16_hd64_bs16_g8"))
    # 4 x 8 x 66 floats of merge buffer (8,448 B) + a 48 KB ring: over MLX's 48,000-byte
    # threshold, so the ring is asked for as it is.
    assert (ring.threadgroup_bytes, ring.ring_bytes) == (8448, 49152)
    assert cuda_dynamic_shared(ring) == 49152
    wide = define(KernelSpec.parse("decode_tc_wide_cuda_bf16_hd128_bs16_g8"))
    assert cuda_dynamic_shared(wide) == wide.ring_bytes == 196608
    simt = define(KernelSpec.parse("decode_simt_cuda_bf16_hd128_bs16_g4"))
    assert cuda_dynamic_shared(simt) == 0
    # Under the threshold but past 48 KB beside the static arrays: lifted just over it.
    tight = dataclasses.replace(ring, threadgroup_bytes=30000, ring_bytes=24576)
    assert cuda_dynamic_shared(tight) == 48001


def test_every_spec_renders_within_the_limits():
    for backend in ("metal", "cuda"):
        for spec in all_specs(backend):
            defn = define(spec)
            assert f"// {spec.name}\n" in defn.source
            if backend == "metal":
                assert defn.threadgroup_bytes + defn.ring_bytes <= 32 * 1024


def test_metal_names_appear_literally_and_cuda_uses_its_own():
    for metal in representative_specs("metal"):
        source = define(metal).source
        cuda = define(dataclasses.replace(metal, backend="cuda"))
        assert "simd_" in source and "threadgroup_position_in_grid" in source
        assert not any(name in cuda.source for name in METAL_ATTRIBUTES)
        assert "blockIdx" in cuda.source and "threadgroup_barrier" not in cuda.source
        assert "__syncthreads" not in source and "__shfl" not in source
        if not metal.is_reduce:
            assert "threadgroup float tg_o[NSG][GQA][VALUE_DIM];" in source
            assert "__shared__ float tg_o[NSG][GQA][VALUE_DIM];" in cuda.source


def _definition(**changes) -> KernelDefinition:
    fields = dict(
        name="k",
        backend="metal",
        spec=None,
        source="out[0] = inp[0];",
        header="",
        input_names=("inp",),
        output_names=("out",),
        threads_per_threadgroup=128,
        threadgroup_bytes=1024,
    )
    return KernelDefinition(**(fields | changes))


def test_render_checks_reject_what_a_backend_cannot_run():
    assert check_definition(_definition()).threadgroup_bytes == 1024
    with pytest.raises(KernelRenderError, match="33000 bytes of threadgroup memory"):
        check_definition(_definition(threadgroup_bytes=33000))
    with pytest.raises(KernelRenderError, match="40000 static"):
        check_definition(_definition(backend="cuda", threadgroup_bytes=40000, ring_bytes=200000))
    with pytest.raises(KernelRenderError, match="2048 threads"):
        check_definition(_definition(threads_per_threadgroup=2048))
    many = tuple(f"in{i}" for i in range(16))
    body = " ".join(f"{n}[0]; {n}_strides[0];" for n in many) + " out[0];"
    with pytest.raises(KernelRenderError, match="33 kernel arguments"):
        check_definition(_definition(input_names=many, source=body))
    with pytest.raises(KernelRenderError, match="'unused' is never used"):
        check_definition(_definition(input_names=("inp", "unused")))
