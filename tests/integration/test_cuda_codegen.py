"""The CUDA renderings compile (NVRTC, sm_90a, no GPU needed) and ptxas reports their registers;
the check fails on broken bodies."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from mlx_paged.codegen.build import KernelDefinition
from mlx_paged.kernels import gated_delta, latent_attention, layer_kernels
from mlx_paged.kernels.catalog import (
    all_specs,
    quantized_specs,
    representative_specs,
    score_rule_specs,
    value_dim_specs,
)
from mlx_paged.kernels.gated_delta import gated_delta_specs, gated_delta_step_specs
from mlx_paged.kernels.kernel_spec import KernelSpec
from mlx_paged.kernels.paged_attention_geometry import define
from mlx_paged.kernels.paged_attention_routing import routed_specs

pytest.importorskip("nvidia.cuda_nvrtc", reason="NVRTC wheel is installed on Linux only")
from mlx_paged.codegen.cuda_check import CudaCheckError, check_cuda_source, wrap  # noqa: E402

LLAMA = KernelSpec.parse("decode_simt_splitk_cuda_bf16_hd128_bs16_g4_p512")


def test_every_representative_spec_compiles():
    reports = {
        spec.name: check_cuda_source(define(spec))
        for spec in representative_specs("cuda") + [LLAMA]
    }
    assert len(reports) == 26
    for name, report in reports.items():
        assert 0 < report.registers <= 255, name
    # The shape the benchmarks and the 1B llama run: compiled without spilling.
    assert reports[LLAMA.name].spill_bytes == 0
    assert reports[LLAMA.name].shared_bytes == define(LLAMA).threadgroup_bytes


def test_routed_cuda_kernels_compile_without_spilling():
    """What the launcher runs on an H200 for the benchmarks' shape: the direct split-K's two
    sub-pages in flight take ~217 registers (2 threadgroups of 128 lanes per SM), none spilled."""
    for spec in routed_specs("cuda", mx.bfloat16, 128, 16, 4, False):
        report = check_cuda_source(define(spec))
        assert report.spill_bytes == 0 and 0 < report.registers <= 255, (spec.name, report)


def test_value_dim_cuda_kernels_compile_without_spilling():
    """Up to GQA 4 in half precision; at GQA 8, K 192 / V 128 spills a little (76 bytes in
    blocks of 32), as fp32 does."""
    for spec in value_dim_specs("cuda"):
        report = check_cuda_source(define(spec))
        assert 0 < report.registers <= 255, (spec.name, report)
        small = spec.dtype != "float32" and spec.gqa <= 4
        assert report.spill_bytes == 0 or not small, (spec.name, report)
        assert report.spill_bytes <= 128 or spec.dtype == "float32", (spec.name, report)


def test_score_rule_cuda_kernels_compile_without_spilling():
    for spec in score_rule_specs("cuda"):
        report = check_cuda_source(define(spec))
        assert 0 < report.registers <= 255, (spec.name, report)
        assert report.spill_bytes == 0 or spec.dtype == "float32", (spec.name, report)


def test_quantized_cuda_kernels_compile_without_spilling():
    """Half-precision ones spill nothing; fp32 at head dim 256 may spill a little, as its plain
    kernel does more (1,368 bytes at GQA 1)."""
    for spec in quantized_specs("cuda"):
        report = check_cuda_source(define(spec))
        assert 0 < report.registers <= 255, (spec.name, report)
        assert report.spill_bytes == 0 or spec.dtype == "float32", (spec.name, report)
    unit = wrap(define(quantized_specs("cuda")[2]))  # K 8-bit, V 4-bit
    assert "const uint32_t* kv_pages" in unit and "const uint32_t* v_pages" in unit
    assert "const T* k_scales" in unit and "using T = float;" in unit  # fp32 scales


def test_gated_delta_cuda_kernels_compile_without_spilling():
    for spec in gated_delta_specs("cuda") + gated_delta_step_specs("cuda"):
        report = check_cuda_source(gated_delta.define(spec))
        assert report.spill_bytes == 0 and 0 < report.registers <= 255, (spec.name, report)
    unit = wrap(gated_delta.define(gated_delta_specs("cuda")[0]))
    assert (
        "const float* g," in unit
        and "float* state_out" in unit
        and "const __nv_bfloat16* beta," in unit
    )


def test_latent_attention_cuda_kernels_compile_within_their_registers():
    """The MLA decode kernels: SIMT and tensor-core pass 1 (16 heads a threadgroup over a
    staged tile of 16 tokens' latent rows) and the merge. The tensor-core pass 1 is held to
    128 registers (four threadgroups an SM) and spills nothing there."""
    specs = latent_attention.latent_specs("cuda")
    assert {s.kernel for s in specs} == {"simt", "mma", "reduce"}
    for spec in specs:
        report = check_cuda_source(latent_attention.define(spec))
        if spec.tensor_cores:
            assert report.registers <= 128, (spec.name, report)
        assert report.spill_bytes == 0 and 0 < report.registers <= 255, (spec.name, report)
    unit = wrap(latent_attention.define(specs[2]))  # tensor cores, bf16
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16" in unit
    assert "const __nv_bfloat16* latent_pages" in unit and "float* partial_max" in unit


def test_layer_kernels_compile_without_spilling():
    """`--lean-decode fused`'s kernels: add + RMSNorm, SwiGLU and the q/k/v heads' RoPE."""
    specs = layer_kernels.layer_kernel_specs("cuda")
    assert {s.kind for s in specs} == set(layer_kernels.KINDS)
    for spec in specs:
        report = check_cuda_source(layer_kernels.define(spec))
        assert report.spill_bytes == 0 and 0 < report.registers <= 64, (spec.name, report)
    unit = wrap(layer_kernels.define(layer_kernels.LayerKernelSpec.parse(
        "qkv_rope_cuda_bf16_hd128_h32k8_qkn")))  # fmt: skip
    assert "const int32_t* positions" in unit and "const float* rope_inv_freq" in unit
    assert "const __nv_bfloat16* q_norm" in unit and "__nv_bfloat16* queries" in unit
    # The page-writing form takes the pages as MLX passes inputs and returns only queries.
    writes = layer_kernels.LayerKernelSpec.parse("qkv_rope_cuda_bf16_hd128_h32k8_qkn_pages")
    unit = wrap(layer_kernels.define(writes))
    assert "const __nv_bfloat16* k_pages" in unit and "const int32_t* slots" in unit
    assert "__nv_bfloat16* keys," not in unit and "const_cast<T*>(v_pages)" in unit


def test_signature_is_mlx_shaped():
    unit = wrap(define(LLAMA))
    assert "__global__ void decode_simt_splitk_cuda_bf16_hd128_bs16_g4_p512(" in unit
    assert "const __nv_bfloat16* k_pages" in unit and "float* partial_max" in unit
    assert "const __grid_constant__ Strides block_tables_strides" in unit
    assert "using T = __nv_bfloat16;" in unit


@pytest.mark.parametrize(
    "bad,message",
    [
        ("simd_sum(pa_l[0]);", 'identifier "simd_sum" is undefined'),  # a Metal builtin
        ("threadgroup float x[4];", "threadgroup"),  # a Metal qualifier
        ("const int pa_len = 0;", "already been declared"),  # a clash with the body
    ],
)
def test_broken_bodies_fail(bad, message):
    defn = define(LLAMA)
    anchor = "const int pa_len = seq_lens[pa_seq];"
    broken = dataclasses.replace(defn, source=defn.source.replace(anchor, anchor + "\n" + bad))
    assert isinstance(broken, KernelDefinition)
    with pytest.raises(CudaCheckError, match=message):
        check_cuda_source(broken)


def test_cli_renders_and_checks_a_cuda_spec(capsys):
    from mlx_paged.cli.main import main

    assert (
        main(["kernels", "render", "decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024", "--check"])
        == 0
    )
    out, err = capsys.readouterr()
    assert "__global__ void decode_tc_splitk_cuda_bf16_hd128_bs16_g4_p1024(" in out
    assert "NVRTC compile check passed (" in err and "0 B spilled" in err
    assert main(["kernels", "render", "decode_tc_metal_bf16_hd128_bs16_g4"]) == 2
    assert "tensor-core kernels are CUDA only" in capsys.readouterr().err
    assert main(["kernels", "list", "--backend", "cuda"]) == 0
    listing = capsys.readouterr()
    assert "decode_tc_cuda_bf16_hd128_bs16_g4\n" in listing.out
    assert "latent_mma_cuda_bf16_r512_p64_bs16\n" in listing.out  # the MLA kernels' sample
    assert "qkv_rope_cuda_bf16_hd128_h32k8_qkn\n" in listing.out  # and the layer kernels'
    count = len(all_specs("cuda")) + len(latent_attention.latent_specs("cuda"))
    count += len(layer_kernels.layer_kernel_specs("cuda"))
    assert f"{count} specs" in listing.err


def test_cli_renders_the_quantize_kernel_on_either_backend(capsys):
    from mlx_paged.cli.main import main

    name = "quantize_rows_cuda_bf16_hd128_k4v4gs32"
    assert main(["kernels", "render", name, "--check"]) == 0
    out, err = capsys.readouterr()
    assert f"__global__ void {name}(" in out and "NVRTC compile check passed (" in err
    assert main(["kernels", "render", name, "--backend", "metal", "--check"]) == 0
    out, err = capsys.readouterr()
    assert "device uint32_t* rows [[buffer(" in out and "clang compile check passed" in err
    assert main(["kernels", "render", "quantize_rows_cuda_bf16_hd128_k16v16gs32"]) == 2
    assert "not a quantized page layout" in capsys.readouterr().err
    assert main(["kernels", "render", "quantize_rows_cuda_bf16"]) == 2
    assert "not a quantize kernel name" in capsys.readouterr().err


def test_cli_renders_the_layer_kernels_on_either_backend(capsys):
    from mlx_paged.cli.main import main

    name = "qkv_rope_cuda_bf16_hd128_h32k8_qkn"
    assert main(["kernels", "render", name, "--check"]) == 0
    out, err = capsys.readouterr()
    assert f"__global__ void {name}(" in out and "NVRTC compile check passed (" in err
    assert main(["kernels", "render", "swiglu_cuda_f16", "--backend", "metal", "--check"]) == 0
    out, err = capsys.readouterr()
    assert "device float16_t* out [[buffer(" in out and "clang compile check passed" in err
    assert main(["kernels", "render", "swiglu_cuda"]) == 2
    assert "not a layer kernel name" in capsys.readouterr().err


def test_cli_renders_the_recurrence_kernel_on_either_backend(capsys):
    from mlx_paged.cli.main import main

    name = "gated_delta_cuda_bf16_hk16_hv32_dk128_dv128"
    assert main(["kernels", "render", name, "--check"]) == 0
    out, err = capsys.readouterr()
    assert f"__global__ void {name}(" in out and "NVRTC compile check passed (" in err
    assert main(["kernels", "render", name, "--backend", "metal", "--check"]) == 0
    assert "clang compile check passed" in capsys.readouterr().err
    assert main(["kernels", "render", "gated_delta_cuda_bf16_hk16_hv32_dk100_dv128"]) == 2
    assert "key head size 100" in capsys.readouterr().err
    assert main(["kernels", "render", "gated_delta_cuda_bf16_hk16"]) == 2
    assert "not a gated-delta kernel name" in capsys.readouterr().err
    step = "gated_delta_step_cuda_bf16_hk16_hv32_dk128_dv128_conv4"
    assert main(["kernels", "render", step, "--check"]) == 0
    assert f"__global__ void {step}(" in capsys.readouterr().out
    for wrong in (step.replace("_conv4", ""), name + "_conv4", step.replace("conv4", "conv9")):
        assert main(["kernels", "render", wrong]) == 2
    assert "conv size 9" in capsys.readouterr().err
