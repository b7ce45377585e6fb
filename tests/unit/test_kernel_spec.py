"""KernelSpec names, the pass-1 geometry, and the render-time checks (pure Python + Jinja)."""

from __future__ import annotations

import dataclasses
import re

import mlx.core as mx
import pytest

from mlx_paged.codegen.build import KernelDefinition, KernelRenderError, check_definition, define
from mlx_paged.codegen.catalog import all_specs, representative_specs
from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_geometry import Geometry, geometry
from mlx_paged.kernels.paged_attention_routing import (decode_specs, grid_partitions,
                                                       routed_partition_size,
                                                       routed_single_pass_variant, routed_specs,
                                                       routed_variant, use_single_pass)

METAL_ATTRIBUTES = ("threadgroup_position_in_grid", "threadgroups_per_grid",
                    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
                    "thread_index_in_threadgroup")


def test_name_says_the_variant_and_parses_back():
    spec = KernelSpec("paged_decode", "metal", "bfloat16", 128, 16, 4, 512)
    assert spec.name == "paged_decode_metal_bf16_hd128_bs16_g4_p512"
    sw = KernelSpec("paged_decode_reduce", "cuda", "float32", 80, 8, 3, 128, True)
    assert sw.name == "paged_decode_reduce_cuda_f32_hd80_bs8_g3_p128_sw"
    for backend in ("metal", "cuda"):
        for s in all_specs(backend):
            assert KernelSpec.parse(s.name) == s


@pytest.mark.parametrize("kwargs,message", [
    (dict(head_dim=48), "head_dim=48"), (dict(block_size=64), "block_size=64"),
    (dict(gqa=9), "gqa=9"), (dict(dtype="int8"), "dtype='int8'"),
    (dict(backend="vulkan"), "backend='vulkan'"), (dict(partition_size=100), "partition_size"),
])
def test_unsupported_values_raise_naming_the_spec(kwargs, message):
    args = dict(op="paged_decode", backend="metal", dtype="bfloat16", head_dim=128,
                block_size=16, gqa=4, partition_size=512) | kwargs
    with pytest.raises(UnsupportedSpecError, match=message) as info:
        KernelSpec(**args)
    assert "paged_decode_" in str(info.value)


def test_simdgroup_override_is_named_and_rendered():
    spec = KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512, True, simdgroups=8)
    assert spec.name == "paged_decode_cuda_bf16_hd128_bs16_g4_p512_sw_w8"
    assert KernelSpec.parse(spec.name) == spec
    assert geometry(spec).nsg == 8
    defn = define(spec)
    assert defn.threads_per_threadgroup == 256 and "constexpr int NSG = 8;" in defn.source
    # 16 simdgroups x 4 heads x 130 floats is 33,280 bytes: over the limit, refused by name.
    with pytest.raises(KernelRenderError, match="_w16: 33280 bytes of threadgroup memory"):
        define(KernelSpec("paged_decode", "metal", "bfloat16", 128, 16, 4, 0, simdgroups=16))
    with pytest.raises(UnsupportedSpecError, match="simdgroups=3"):
        KernelSpec("paged_decode", "metal", "bfloat16", 128, 16, 4, 0, simdgroups=3)


def test_ring_variant_is_named_and_sized():
    spec = KernelSpec("paged_decode", "metal", "float16", 64, 16, 4, 0, True, stages=2,
                      simdgroups=2)
    assert spec.name == "paged_decode_metal_f16_hd64_bs16_g4_p0_sw_s2_w2"
    assert KernelSpec.parse(spec.name) == spec
    plain = KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512)
    ring = KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512, stages=3)
    assert (geometry(plain).stages, geometry(ring).stages, geometry(ring).stage_rows) == (1, 3, 16)
    # 4 simdgroups x 3 slots x (16 rows of K + 16 of V) x 256 bytes, dynamic on CUDA.
    assert define(ring).ring_bytes == 4 * 3 * 2 * 16 * 256 and define(plain).ring_bytes == 0
    assert "mlx_paged_cp_async16(" in define(ring).source
    assert "extern __shared__ uint4 pa_ring[];" in define(ring).source
    assert "pa_ring" not in define(plain).source
    # A slot holds at most 4 KB of K: 8 rows of hd256 bf16 per step.
    assert geometry(KernelSpec("paged_decode", "cuda", "bfloat16", 256, 32, 2, 0, stages=2)).stage_rows == 8
    # Metal keeps everything in its 32 KB: the same ring does not fit there.
    with pytest.raises(KernelRenderError, match="threadgroup memory"):
        define(ring.with_backend("metal"))
    with pytest.raises(UnsupportedSpecError, match="pass 1 only"):
        KernelSpec("paged_decode_reduce", "cuda", "bfloat16", 128, 16, 4, 512, stages=2)
    with pytest.raises(UnsupportedSpecError, match="stages=9"):
        KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512, stages=9)
    # Deeper rings than 4 slots: the tensor-core ring only.
    with pytest.raises(UnsupportedSpecError, match="tensor-core path only"):
        define(KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512, stages=5))
    deep = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s6_w1_fused")
    assert (geometry(deep).stages, geometry(deep).nsg) == (6, 1)
    assert define(deep).ring_bytes == 6 * 2 * 16 * 128 * 2


def test_cuda_ring_beside_static_memory_asks_mlx_to_raise_the_limit():
    from mlx_paged.codegen.build import cuda_dynamic_shared

    # 16.5 KB of merge buffer + a 32 KB ring pass 48 KB, but MLX only raises the limit for
    # requests over 48,000 bytes: the request is lifted just over that.
    tight = define(KernelSpec.parse("paged_decode_cuda_bf16_hd256_bs16_g8_p512_s2"))
    assert (tight.threadgroup_bytes, tight.ring_bytes) == (16512, 32768)
    assert cuda_dynamic_shared(tight) == 48001
    roomy = define(KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512_s2"))
    assert cuda_dynamic_shared(roomy) == roomy.ring_bytes == 65536
    assert cuda_dynamic_shared(define(KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512"))) == 0


def test_tuning_suffixes_parse_and_override_the_geometry():
    assert KernelSpec.parse_tuning("s3_t32_c2_w8") == dict(stages=3, lanes_per_row=32,
                                                          chunk=2, simdgroups=8)
    assert KernelSpec.parse_tuning("s2_c4") == dict(stages=2, chunk=4)
    assert KernelSpec.parse_tuning("") == {}
    with pytest.raises(UnsupportedSpecError, match="'x9' in 's2_x9' is not a tuning variant"):
        KernelSpec.parse_tuning("s2_x9")
    with pytest.raises(UnsupportedSpecError, match="'pl' in 'pl' is not a tuning variant"):
        KernelSpec.parse_tuning("pl")
    spec = KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 4, 512, lanes_per_row=32,
                      chunk=2)
    assert spec.tuning_suffix == "t32_c2" and KernelSpec.parse(spec.name) == spec
    assert geometry(spec) == Geometry(nsg=4, tpr=32, epl=4, chunk=2, vector_loads=False,
                                      stages=1, stage_rows=0)
    # 16 lanes x 8 rows per simdgroup exceed a block of 8 tokens; 3 does not divide 8 tokens.
    with pytest.raises(UnsupportedSpecError, match="lanes per row"):
        geometry(KernelSpec("paged_decode", "cuda", "float32", 64, 8, 1, 0, lanes_per_row=2))
    with pytest.raises(UnsupportedSpecError, match="chunk of 16 tokens"):
        geometry(KernelSpec("paged_decode", "cuda", "bfloat16", 128, 16, 1, 0, chunk=16))


def test_reduce_needs_a_partition_and_parse_rejects_garbage():
    with pytest.raises(UnsupportedSpecError, match="partition"):
        KernelSpec("paged_decode_reduce", "cuda", "float16", 64, 16, 1, 0)
    with pytest.raises(UnsupportedSpecError, match="not a kernel spec name"):
        KernelSpec.parse("paged_decode_metal_bf16_hd128")
    with pytest.raises(UnsupportedSpecError, match="unknown kernel"):
        KernelSpec.parse("flash_prefill_metal_bf16_hd128_bs16_g4_p0")


@pytest.mark.parametrize("dtype,hd,bs,g,expected", [
    ("bfloat16", 128, 16, 4, Geometry(nsg=4, tpr=16, epl=8, chunk=8, vector_loads=True, stages=1, stage_rows=0)),
    ("bfloat16", 128, 16, 8, Geometry(nsg=4, tpr=16, epl=8, chunk=4, vector_loads=True, stages=1, stage_rows=0)),
    ("float32", 128, 16, 4, Geometry(nsg=4, tpr=32, epl=4, chunk=8, vector_loads=True, stages=1, stage_rows=0)),
    ("bfloat16", 80, 8, 3, Geometry(nsg=4, tpr=8, epl=10, chunk=2, vector_loads=False, stages=1, stage_rows=0)),
    ("float32", 96, 32, 1, Geometry(nsg=4, tpr=16, epl=6, chunk=16, vector_loads=False, stages=1, stage_rows=0)),
    # 4 simdgroups x 8 heads x 256 dims of fp32 would need 33 KB: halved to 2 simdgroups.
    ("bfloat16", 256, 16, 8, Geometry(nsg=2, tpr=32, epl=8, chunk=4, vector_loads=True, stages=1, stage_rows=0)),
])
def test_geometry(dtype, hd, bs, g, expected):
    assert geometry(KernelSpec("paged_decode", "cuda", dtype, hd, bs, g, 0)) == expected


def test_every_spec_renders_for_both_backends_within_limits():
    for backend in ("metal", "cuda"):
        specs = all_specs(backend)
        assert len(specs) == 5040
        for spec in specs:
            defn = define(spec)
            assert defn.threadgroup_bytes <= 32 * 1024
            assert f"// {spec.name}\n" in defn.source


def test_metal_names_appear_literally_and_cuda_uses_its_own():
    for metal in representative_specs("metal"):
        source = define(metal).source
        cuda = define(metal.with_backend("cuda"))
        assert "simd_" in source and "threadgroup_position_in_grid" in source
        assert not any(name in cuda.source for name in METAL_ATTRIBUTES)
        assert "blockIdx" in cuda.source and "threadgroup_barrier" not in cuda.source
        assert ("__shfl_xor_sync" in cuda.source) or ("mlx_paged_warp_" in cuda.source)
        assert "__syncthreads" not in source and "__shfl" not in source
        if metal.op == "paged_decode":
            assert "threadgroup float tg_o[NSG][GQA][HEAD_DIM];" in source
            assert "__shared__ float tg_o[NSG][GQA][HEAD_DIM];" in cuda.source


def _definition(**changes) -> KernelDefinition:
    spec = KernelSpec("paged_decode", "metal", "float16", 64, 16, 1, 0)
    fields = dict(spec=spec, source="out[0] = inp[0];", header="", input_names=("inp",),
                  output_names=("out",), threads_per_threadgroup=128, threadgroup_bytes=1024)
    return KernelDefinition(**(fields | changes))


def test_render_checks_reject_what_a_backend_cannot_run():
    assert check_definition(_definition()).threadgroup_bytes == 1024
    with pytest.raises(KernelRenderError, match="33000 bytes of threadgroup memory"):
        check_definition(_definition(threadgroup_bytes=33000))
    with pytest.raises(KernelRenderError, match="2048 threads"):
        check_definition(_definition(threads_per_threadgroup=2048))
    many = tuple(f"in{i}" for i in range(16))
    body = " ".join(f"{n}[0]; {n}_strides[0];" for n in many) + " out[0];"
    with pytest.raises(KernelRenderError, match="33 kernel arguments"):
        check_definition(_definition(input_names=many, source=body))
    with pytest.raises(KernelRenderError, match="'unused' is never used"):
        check_definition(_definition(input_names=("inp", "unused")))


def test_tensor_core_variant_is_cuda_bf16_fp16_only():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512_sw_mma_w2")
    assert spec.tensor_cores and spec.simdgroups == 2 and spec.tuning_suffix == "mma_w2"
    geo = geometry(spec)
    # K: 32 dims (64 bytes) per lane per token; V: 16 dims (32 bytes): whole 16-byte loads.
    assert (geo.tensor_cores, geo.mma_k_width, geo.mma_v_width, geo.nsg) == (True, 16, 16, 2)
    # hd80: 40-byte K slices and 20-byte V slices load 8 and 4 bytes at a time.
    hd80 = geometry(KernelSpec("paged_decode", "cuda", "float16", 80, 32, 3, 0, tensor_cores=True))
    assert (hd80.mma_k_width, hd80.mma_v_width) == (8, 4)
    source = define(spec).source
    assert "mlx_paged_mma(sc[n], mm_q[s][0], 0u, mm_q[s][1], 0u, kw[0], kw[1], T{});" in source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in define(spec).header
    assert "mlx_paged_mma" not in define(dataclasses.replace(spec, tensor_cores=False)).source
    refusals = [("metal", "float16", 16, {}, "CUDA only"),
                ("cuda", "float32", 16, {}, "bf16/fp16"),
                ("cuda", "bfloat16", 8, {}, "16-token sub-pages"),
                ("cuda", "bfloat16", 16, {"chunk": 2}, "wN, uN and sN only")]
    for backend, dtype, block, extra, message in refusals:
        with pytest.raises(UnsupportedSpecError, match=message):
            geometry(KernelSpec("paged_decode", backend, dtype, 128, block, 4, 0,
                                tensor_cores=True, **extra))


def test_long_partitions_are_specs_outside_the_catalog():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p4096")
    assert spec.partition_size == 4096 and "constexpr int PARTITION = 4096;" in define(spec).source
    assert all(s.partition_size <= 512 for s in all_specs("cuda"))
    with pytest.raises(UnsupportedSpecError, match="partition_size=32768"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p32768")


def test_fused_and_launch_bound_variants_are_named_and_refused_where_they_cannot_run():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_fused")
    assert spec.fused_reduce and spec.tensor_cores and spec.tuning_suffix == "mma_fused"
    defn = define(spec)
    # One launch: the counters come in, the answer and the partials go out.
    assert defn.input_names[-1] == "counters"
    assert defn.output_names == ("out", "partials", "counters_next")
    assert "atomicAdd(fr_counter, 1)" in defn.source and "__ldcg(partial_max" in defn.source
    # The three partials are carved out of the one output (MLX's host time grows per output).
    assert ("float* partial_max = partials + pa_partial_rows * HEAD_DIM;\n"
            "float* partial_sum = partial_max + pa_partial_rows;") in defn.source
    two_pass = define(dataclasses.replace(spec, fused_reduce=False))
    assert two_pass.output_names == ("partial_out", "partial_max", "partial_sum")
    assert "atomicAdd" not in two_pass.source
    with pytest.raises(UnsupportedSpecError, match="needs a partition size"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_fused")
    with pytest.raises(UnsupportedSpecError, match="fused reduce is CUDA only"):
        define(KernelSpec.parse("paged_decode_metal_bf16_hd128_bs16_g4_p512_fused"))
    bounded = define(KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512_c2_o5"))
    assert bounded.header.startswith("#undef __global__\n")
    assert "__launch_bounds__(128, 5)" in bounded.header
    with pytest.raises(UnsupportedSpecError, match="Metal has none"):
        define(KernelSpec.parse("paged_decode_metal_bf16_hd128_bs16_g4_p512_o4"))
    with pytest.raises(UnsupportedSpecError, match="occupancy=9"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512_o9")


def test_routing_takes_tensor_cores_and_the_fused_split_k_only_where_measured():
    bf16 = mx.bfloat16
    assert routed_variant("cuda", bf16, 128, 16) == "mma_s3_fused"
    assert routed_variant("cuda", bf16, 128, 16, 16384) == "mma_s3_fused"
    assert routed_variant("cuda", bf16, 128, 16, 16400) == "mma_u2_fused"
    assert routed_variant("cuda", mx.float16, 128, 32, 32768) == "mma_u2_fused"
    assert routed_variant("cuda", bf16, 64, 16) == "mma_s3_fused"
    assert routed_variant("cuda", mx.float16, 64, 32, 32768) == "mma_u2_fused"
    for args in (("metal", bf16, 128, 16), ("cuda", mx.float32, 128, 16),
                 ("cuda", bf16, 80, 16), ("cuda", bf16, 96, 16), ("cuda", bf16, 256, 16),
                 ("cuda", bf16, 128, 8), ("cuda", bf16, 64, 8)):
        assert routed_variant(*args) == "" and routed_variant(*args, 32768) == "", args
    assert routed_partition_size("mma_fused", 2048, 8) == 1024
    assert routed_partition_size("mma_fused", 16384, 8) == 1024
    assert routed_partition_size("mma_fused", 16400, 40) == 2048
    assert routed_partition_size("mma_fused", 32768, 384) == 2048
    assert routed_partition_size("", 32768, 8) == 512
    # Under 40 groups past 16k tokens: the threadgroups closest to 256.
    assert routed_partition_size("mma_u2_fused", 32768, 8) == 1024     # 256
    assert routed_partition_size("mma_u2_fused", 32768, 16) == 2048    # 256
    assert routed_partition_size("mma_u2_fused", 32768, 32) == 4096    # 256
    assert routed_partition_size("mma_u2_fused", 32768, 39) == 4096    # 312
    assert routed_partition_size("mma_u2_fused", 20480, 8) == 1024     # 160
    assert routed_partition_size("mma_u2_fused", 65536, 8) == 2048     # 256
    cuda = [s.name for s in routed_specs("cuda", bf16, 128, 16, 4, False)]
    # Two single passes (8 simdgroups up to 72 groups, 4 past), the fused split-K at 1024
    # tokens up to 16k, and at each length the few-group rule picks past it.
    assert cuda == ["paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_s3_w8",
                    "paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_s3",
                    "paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_fused",
                    "paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_u2_fused",
                    "paged_decode_cuda_bf16_hd128_bs16_g4_p2048_mma_u2_fused",
                    "paged_decode_cuda_bf16_hd128_bs16_g4_p4096_mma_u2_fused"]
    assert routed_single_pass_variant("cuda", bf16, 128, 16, 1) == "mma_s3_w8"
    assert routed_single_pass_variant("cuda", bf16, 128, 16, 72) == "mma_s3_w8"
    assert routed_single_pass_variant("cuda", bf16, 128, 16, 73) == "mma_s3"
    assert routed_single_pass_variant("cuda", bf16, 64, 16, 8) == "mma_s3_w8"
    assert routed_single_pass_variant("cuda", bf16, 96, 16, 8) == ""
    assert routed_single_pass_variant("metal", bf16, 128, 16, 8) == ""
    metal = [s.name for s in routed_specs("metal", bf16, 128, 16, 4, True)]
    assert metal == ["paged_decode_metal_bf16_hd128_bs16_g4_p0_sw",
                     "paged_decode_metal_bf16_hd128_bs16_g4_p512_sw",
                     "paged_decode_reduce_metal_bf16_hd128_bs16_g4_p512_sw"]


def test_single_pass_rule_of_the_tensor_core_kernels_and_of_the_fma_kernel():
    # Tensor cores: single pass from 40 (sequence, KV head) groups, and at any count on tables
    # of up to 2048 tokens; on tables past 16k tokens not while the second wave of 264
    # threadgroups is under three quarters full (265-461 groups).
    assert not use_single_pass(4, 8, 8, True, 8192)        # 32 groups
    assert not use_single_pass(4, 8, 3, True, 2064)
    assert use_single_pass(1, 8, 2, True, 2048)            # 8 on a short table
    assert use_single_pass(5, 8, 8, True, 8192)            # 40
    assert use_single_pass(5, 8, 16, True, 32768)
    assert use_single_pass(16, 8, 2, True, 2048)           # 128
    assert use_single_pass(16, 8, 16, True, 32768)
    assert use_single_pass(33, 8, 8, True, 8192)           # 264
    assert use_single_pass(33, 8, 16, True, 32768)
    assert use_single_pass(48, 8, 8, True, 8192)           # 384 at 8k ...
    assert not use_single_pass(48, 8, 16, True, 32768)     # ... not at 32k
    assert not use_single_pass(57, 8, 16, True, 16400)     # 456
    assert use_single_pass(58, 8, 16, True, 32768)         # 464
    assert use_single_pass(64, 8, 16, True, 32768)         # 512
    assert use_single_pass(1, 8, 1, True, 512)             # one partition: always
    with pytest.raises(ValueError, match="width"):
        use_single_pass(1, 8, 4, True)
    # The FMA kernel keeps its own sweep's thresholds.
    assert not use_single_pass(16, 8, 2)
    assert not use_single_pass(64, 8, 5)
    assert use_single_pass(64, 8, 4)
    assert use_single_pass(128, 8, 64)
    assert use_single_pass(1, 8, 1)


def test_grid_partitions_fill_whole_waves_and_respect_the_shortest_partition():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p256_mma_fused_pg")
    assert spec.grid_partitions and spec.fused_reduce and spec.partition_size == 256
    source = define(spec).source
    assert "const int PARTITION = (block_tables_shape[1] + gridDim.z - 1) / gridDim.z" in source
    assert "constexpr int PARTITION" not in source
    with pytest.raises(UnsupportedSpecError, match="need the fused reduce"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p256_pg")
    # The single pass of a split-K-only variant is the plain one.
    single, part1, _ = decode_specs("cuda", mx.bfloat16, 128, 16, 4, False, 256, "mma_fused_pg")
    assert single.name == "paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma" and part1 == spec
    # Against 396 threadgroups a wave: 8 x 8 KV heads -> 6 partitions (384 threadgroups);
    # 64 x 8 -> 3 (1,536, 3.9 waves); batch 1 x 8 -> 45 (360); capped by the shortest length.
    assert grid_partitions(64, 8) == 6
    assert grid_partitions(512, 32) == 3
    assert grid_partitions(8, 256) == 45
    assert grid_partitions(8, 16) == 16
    assert grid_partitions(396, 4) == 1
    assert grid_partitions(5, 0) == 1
    assert grid_partitions(64, 8, target=128) == 2


def test_unrolled_steps_are_a_tensor_core_loop():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_u2_fused")
    assert spec.unroll == 2 and spec.tensor_cores and spec.tuning_suffix == "mma_u2_fused"
    source = define(spec).source
    assert "constexpr int U = 2;" in source and "T kr[U][2][KQ];" in source
    # Sub-pages past the simdgroup's last step are loaded again but weigh nothing.
    assert "valid[n][e] = live && pos >= pa_begin" in source
    plain = define(dataclasses.replace(spec, unroll=0)).source
    assert "constexpr int U" not in plain and "valid[n][e] = pos >= pa_begin" in plain
    with pytest.raises(UnsupportedSpecError, match="tensor-core path loop"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_u2")
    with pytest.raises(UnsupportedSpecError, match="unroll=8"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_u8")


def test_tensor_core_ring_reads_fragments_by_ldmatrix_from_a_swizzled_ring():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_fused")
    defn = define(spec)
    assert geometry(spec).stages == 3 and geometry(spec).stage_rows == 16
    # 4 simdgroups x 3 slots x (16 rows of K + 16 of V) x 128 dims x 2 bytes, dynamic.
    assert defn.ring_bytes == 4 * 3 * 2 * 16 * 128 * 2
    assert "mlx_paged_ldsm_x4_trans(" in defn.source and "mlx_paged_cp_async16_at(" in defn.source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in defn.header
    assert "(mm_c ^ (r & 7))" in defn.source  # the bank swizzle the ldmatrix reads undo
    assert "constexpr int GROUP = HEAD_DIM > 128 ? 2 : 8;" in defn.source  # ldmatrix per group
    plain = define(dataclasses.replace(spec, stages=0))
    assert plain.ring_bytes == 0 and "ldmatrix" not in plain.header
    for bad in ("mma_u2_s2", "mma_u2_s3"):  # the next U sub-pages need U slots of their own
        with pytest.raises(UnsupportedSpecError, match="a multiple of U and at least 2U"):
            define(KernelSpec.parse(f"paged_decode_cuda_bf16_hd128_bs16_g4_p0_{bad}"))
    with pytest.raises(UnsupportedSpecError, match="multiple of 64"):
        define(KernelSpec.parse("paged_decode_cuda_bf16_hd96_bs16_g4_p0_mma_s2"))


def test_tensor_core_ring_takes_several_sub_pages_per_step_with_u():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_u2_s4_fused")
    defn = define(spec)
    assert spec.unroll == 2 and spec.stages == 4 and spec.tuning_suffix == "mma_u2_s4_fused"
    # 4 simdgroups x 4 slots x (16 rows of K + 16 of V) x 128 dims x 2 bytes.
    assert defn.ring_bytes == 4 * 4 * 2 * 16 * 128 * 2
    source = defn.source
    assert "constexpr int U = 2;" in source and "constexpr int GROUPS = STAGES / U;" in source
    assert "mlx_paged_cp_wait<GROUPS - 2>();" in source  # one copy group of U per step
    # Slots past the last sub-page copy the last one; its scores are masked.
    assert "min(nx + u, mm_steps - 1)" in source and "valid[u][n][e] = sp < mm_steps" in source
    single = define(dataclasses.replace(spec, unroll=0)).source
    assert "constexpr int GROUPS" not in single and "mlx_paged_cp_wait<STAGES - 2>();" in single
    with pytest.raises(UnsupportedSpecError, match="head_dim up to 128"):
        define(KernelSpec.parse("paged_decode_cuda_bf16_hd256_bs16_g4_p0_mma_u2_s4"))


def test_tensor_core_ring_swaps_the_operands_with_kq():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_kq_fused")
    assert spec.swap_operands and spec.tuning_suffix == "mma_s3_kq_fused"
    defn = define(spec)
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in defn.header
    source = defn.source
    # K as A (ldmatrix registers 0, 2, 1, 3), Q as B; half the output tiles of mma_s3.
    assert "kb[s][0], kb[s][2], kb[s][1], kb[s][3], mm_q[s][0], mm_q[s][1]" in source
    assert "float mm_o[NT / 2][4];" in source and "tg_o[pa_sg][head][16 * q + mm_g + 8]" in source
    plain = define(dataclasses.replace(spec, swap_operands=False))
    assert "movmatrix" not in plain.header and "float mm_o[NT][4];" in plain.source
    for bad, why in (("mma_kq", "needs sN"), ("mma_u2_s4_kq", "no uN"), ("s2_kq", "(mma)")):
        with pytest.raises(UnsupportedSpecError, match=re.escape(why)):
            define(KernelSpec.parse(f"paged_decode_cuda_bf16_hd128_bs16_g4_p0_{bad}"))
    with pytest.raises(UnsupportedSpecError, match="head_dim up to 128"):
        define(KernelSpec.parse("paged_decode_cuda_bf16_hd256_bs16_g4_p0_mma_s3_kq"))


def _assert_refused(cases):
    """Each (tuning suffix, part of the message): rendering the spec raises, naming why."""
    for bad, why in cases:
        with pytest.raises(UnsupportedSpecError, match=re.escape(why)):
            define(KernelSpec.parse(f"paged_decode_cuda_bf16_hd128_bs16_g4_p0_{bad}"))


def test_tensor_core_ring_prefetches_into_l2_with_pf():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_pf4_fused")
    assert spec.l2_prefetch == 4 and spec.tuning_suffix == "mma_s3_pf4_fused"
    defn = define(spec)
    assert "cp.async.bulk.prefetch.L2.global" in defn.header
    # The first PF sub-pages after the ring's first copies, then one PF past each new copy.
    assert "constexpr int PF = 4;" in defn.source
    assert "for (int j = STAGES - 1; j < STAGES - 1 + PF; ++j) {" in defn.source
    assert "const int pf_sub = st + STAGES - 1 + PF;" in defn.source
    plain = define(dataclasses.replace(spec, l2_prefetch=0))
    assert "prefetch" not in plain.header and "pf_sub" not in plain.source
    kq = define(KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_s3_pf8_kq"))
    assert "const int pf_sub = st + STAGES - 1 + PF;" in kq.source
    _assert_refused((("mma_pf4", "needs sN"), ("mma_u2_s4_pf4", "no uN"),
                     ("s2_pf4", "tensor-core ring only")))
    with pytest.raises(UnsupportedSpecError, match="l2_prefetch=5 is not generated"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_s3_pf5")


def test_tensor_core_ring_rescales_lazily_with_lr():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_lr_fused")
    assert spec.lazy_rescale and spec.tuning_suffix == "mma_s3_lr_fused"
    source = define(spec).source
    # One rescale of all accumulators, skipped by the whole simdgroup when no max grew, and
    # none inside the P.V loop.
    assert "if (__any_sync(0xffffffffu, corr != 1.0f)) {" in source
    assert source.count("*= corr;") == 3  # mm_l, and the two halves of each output tile
    eager = define(dataclasses.replace(spec, lazy_rescale=False)).source
    assert "__any_sync" not in eager and "o[0] *= corr;" in eager
    _assert_refused((("mma_lr", "need sN"), ("mma_u2_s4_lr", "no uN"),
                     ("mma_s3_lr_kq", "no kq"), ("s2_lr", "tensor-core ring only")))


def test_tensor_core_ring_keeps_the_older_max_with_rt():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_rt8_fused")
    assert spec.rescale_threshold == 8 and spec.tuning_suffix == "mma_s3_rt8_fused"
    source = define(spec).source
    assert "if (!__any_sync(0xffffffffu, m_new > mm_m + 8.0f)) m_new = mm_m;" in source
    assert "if (__any_sync(0xffffffffu, corr != 1.0f)) {" in source  # the lazy rescale too
    assert "mm_m + 8.0f" not in define(dataclasses.replace(spec, rescale_threshold=0)).source
    _assert_refused((("mma_rt8", "need sN"), ("mma_u2_s4_rt8", "no uN"),
                     ("mma_s3_rt8_kq", "no kq"), ("s2_rt8", "tensor-core ring only")))
    with pytest.raises(UnsupportedSpecError, match="rescale_threshold=3 is not generated"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p0_mma_s3_rt3")


def test_tensor_core_ring_starts_before_the_length_with_ea():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_ea_fused")
    assert spec.early_loads and spec.tuning_suffix == "mma_s3_ea_fused"
    source = define(spec).source
    check = source.index("if (pa_begin >= pa_end) {")
    # Block ids (guarded by the table's width), query fragments and the ring's first copies
    # (block ids kept inside the pool) come before the length check; the copies land before
    # an empty partition leaves.
    for early in ("pa_lane * NSG < (int(block_tables_shape[1]) - pa_first_page - pa_sg)",
                  "mm_q[s][h] = mlx_paged_pack2(lo, hi);",
                  "min(max(__shfl_sync(0xffffffffu, rg_ids, is_page), 0), int(k_pages_shape[0]) - 1)"):
        assert source.index(early) < check
    assert source.index("mlx_paged_cp_wait<0>();", check) < source.index("return;", check)
    assert source.index("for (int st = 0; st < mm_steps; ++st) {") > check
    late = define(dataclasses.replace(spec, early_loads=False)).source
    assert late.index("mm_q[s][h] = mlx_paged_pack2(lo, hi);") > late.index(
        "if (pa_begin >= pa_end) {")
    assert "block_tables_shape[1]" not in late and "k_pages_shape[0]" not in late
    _assert_refused((("mma_ea", "needs sN"), ("mma_u2_s4_ea", "no uN"),
                     ("s2_ea", "tensor-core ring only")))


def test_tensor_core_ring_shares_pages_out_dynamically_with_dw():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_dw2_fused")
    assert spec.dynamic_pages == 2 and spec.tuning_suffix == "mma_s3_dw2_fused"
    source = define(spec).source
    # Every partition sees the whole sequence; the fixed split's count takes part, the merge
    # counts exactly those, and later grabs come from the group's page counter (slot groups +
    # group, after the merge counters).
    assert "int pa_begin = 0;\nint pa_end = pa_len;" in source
    assert "if (pa_part >= pa_dw_parts) pa_begin = pa_end;" in source
    assert "const int fr_first = 0;\nconst int fr_count = pa_dw_parts;" in source
    assert ("const_cast<int*>(counters) + (seq_lens_shape[0] + pa_seq) * pa_num_kv_heads"
            in source)
    assert source.count("atomicAdd(dw_work, DW)") == 2  # the first dynamic grab, then each
    assert "for (int st = 0; ; ++st) {" in source and "mm_steps" not in source
    static = define(dataclasses.replace(spec, dynamic_pages=0)).source
    assert "dw_" not in static and "pa_dw_parts" not in static
    for bad, why in (("mma_s3_dw2", "needs fused"), ("mma_s3_dw2_fused_pg", "not pg"),
                     ("mma_dw2_fused", "needs sN"), ("mma_u2_s4_dw2_fused", "no uN"),
                     ("mma_s3_kq_dw2_fused", "no uN, kq"), ("mma_s3_ea_dw2_fused", "ea"),
                     ("mma_s6_w1_dw2_fused", "dw2 grabs fewer sub-pages than the ring's 5"),
                     ("s2_dw2_fused", "tensor-core ring only")):
        with pytest.raises(UnsupportedSpecError, match=re.escape(why)):
            define(KernelSpec.parse(f"paged_decode_cuda_bf16_hd128_bs16_g4_p1024_{bad}"))
    with pytest.raises(UnsupportedSpecError, match="dynamic_pages=3 is not generated"):
        KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_dw3_fused")
