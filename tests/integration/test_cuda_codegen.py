"""The CUDA renderings compile (NVRTC, sm_90a, no GPU needed) and ptxas reports their registers;
the check fails on broken bodies."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

from mlx_paged.codegen.build import KernelDefinition, define
from mlx_paged.codegen.catalog import representative_specs
from mlx_paged.codegen.spec import KernelSpec
from mlx_paged.kernels.paged_attention_routing import routed_specs

pytest.importorskip("nvidia.cuda_nvrtc", reason="NVRTC wheel is installed on Linux only")
from mlx_paged.codegen.cuda_check import CudaCheckError, check_cuda_source, wrap  # noqa: E402

LLAMA = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p512")


def test_every_representative_spec_compiles():
    reports = {spec.name: check_cuda_source(define(spec)) for spec in representative_specs("cuda")}
    assert len(reports) == 29
    for name, report in reports.items():
        assert 0 < report.registers <= 255, name
    # The shape the benchmarks and the 1B llama run: compiled without spilling.
    assert reports[LLAMA.name].spill_bytes == 0
    assert reports[LLAMA.name].shared_bytes == define(LLAMA).threadgroup_bytes


def test_tuning_variants_compile():
    for suffix in ("mma", "mma_w2", "s2", "s4_c4", "s2_t32_c2", "w8", "fused", "s2_fused",
                   "o4", "c2_o5", "fused_pg", "mma_fused_pg", "mma_u2", "mma_u3_fused_pg",
                   "mma_s2", "mma_s3_fused", "mma_u2_s4_fused", "mma_u2_s4_w2",
                   "mma_s3_kq_fused", "mma_s2_kq_w8", "mma_s6_w1_fused", "mma_s8_w1",
                   "mma_s5_w2_fused", "mma_s3_dw2_fused", "mma_s3_lr_dw1_fused",
                   "mma_s3_tr_dw4_fused", "mma_s6_w1_dw4_fused"):
        spec = dataclasses.replace(LLAMA, **KernelSpec.parse_tuning(suffix))
        assert check_cuda_source(define(spec)).registers > 0, spec.name
    for name in ("paged_decode_cuda_f16_hd80_bs32_g8_p0_sw_mma",
                 "paged_decode_cuda_bf16_hd64_bs16_g1_p128_mma",
                 "paged_decode_cuda_f32_hd256_bs32_g7_p256_s2",
                 "paged_decode_cuda_f16_hd64_bs32_g2_p512_sw_mma_s3_dw2_fused"):
        assert check_cuda_source(define(KernelSpec.parse(name))).registers > 0, name


def test_routed_cuda_kernels_compile_without_spilling():
    """What the launcher runs on an H200 for the benchmarks' shape (outside the catalog): two
    sub-pages in flight take ~224 registers (2 threadgroups of 128 lanes per SM), none spilled."""
    for spec in routed_specs("cuda", mx.bfloat16, 128, 16, 4, False):
        report = check_cuda_source(define(spec))
        assert report.spill_bytes == 0 and 0 < report.registers <= 255, (spec.name, report)


def test_signature_is_mlx_shaped():
    unit = wrap(define(LLAMA))
    assert "__global__ void paged_decode_cuda_bf16_hd128_bs16_g4_p512(" in unit
    assert "const __nv_bfloat16* k_pages" in unit and "float* partial_max" in unit
    assert "const __grid_constant__ Strides block_tables_strides" in unit
    assert "using T = __nv_bfloat16;" in unit


@pytest.mark.parametrize("bad,message", [
    ("simd_sum(pa_l[0]);", "identifier \"simd_sum\" is undefined"),    # a Metal builtin
    ("threadgroup float x[4];", "threadgroup"),                          # a Metal qualifier
    ("const int pa_len = 0;", "already been declared"),                  # a clash with the body
])
def test_broken_bodies_fail(bad, message):
    defn = define(LLAMA)
    anchor = "const int pa_len = seq_lens[pa_seq];"
    broken = dataclasses.replace(defn, source=defn.source.replace(anchor, anchor + "\n" + bad))
    assert isinstance(broken, KernelDefinition)
    with pytest.raises(CudaCheckError, match=message):
        check_cuda_source(broken)


def test_cli_renders_and_checks_a_cuda_spec(capsys):
    from mlx_paged.cli import main

    assert main(["kernels", "render", "paged_decode_cuda_bf16_hd128_bs16_g4_p512_mma",
                 "--check"]) == 0
    out, err = capsys.readouterr()
    assert "__global__ void paged_decode_cuda_bf16_hd128_bs16_g4_p512_mma(" in out
    assert "NVRTC compile check passed (" in err and "0 B spilled" in err
    assert main(["kernels", "render", "paged_decode_metal_bf16_hd128_bs16_g4_p512_mma"]) == 2
    assert "the tensor-core path is CUDA only" in capsys.readouterr().err
    assert main(["kernels", "list", "--backend", "cuda"]) == 0
    listing = capsys.readouterr()
    assert "paged_decode_cuda_bf16_hd128_bs16_g4_p512\n" in listing.out
    assert "5040 specs" in listing.err
