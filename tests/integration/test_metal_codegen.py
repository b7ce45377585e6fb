"""The Metal rendering, as MLX itself wraps it: golden sources and a clang compile check.

The complete MSL is captured through `mx.export_function` + `verbose=True` on this CPU build
(MLX will not run a Metal kernel here, but prints what it would compile).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest

from mlx_paged.codegen.metal_check import MetalCheckError, check_metal_source
from mlx_paged.kernels.catalog import (
    quantized_specs,
    representative_specs,
    score_rule_specs,
    value_dim_specs,
)
from mlx_paged.kernels.gated_delta import (
    GatedDeltaSpec,
    gated_delta_specs,
    gated_delta_step_specs,
)
from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.latent_attention import LatentSpec, latent_specs
from mlx_paged.kernels.layer_kernels import LayerKernelSpec, layer_kernel_specs
from mlx_paged.kernels.metal_capture import capture_metal_source
from mlx_paged.kernels.paged_attention import paged_attention_decode
from mlx_paged.kernels.paged_attention_geometry import define
from mlx_paged.kernels.quantize_rows import QuantizeRowsSpec, quantize_rows_specs

GOLDEN = Path(__file__).parent.parent / "golden" / "metal"
SPEC = KernelSpec("decode_simt_splitk", "metal", "bfloat16", 128, 16, 4, 512, True)
# The Metal kernels at a 1B llama's shape: the golden sources a reviewer reads.
GOLDEN_SPECS = [
    KernelSpec("decode_simt", "metal", "bfloat16", 128, 16, 4),
    SPEC,
    KernelSpec("decode_reduce", "metal", "bfloat16", 128, 16, 4, 512, True),
    KernelSpec("decode_simt", "metal", "bfloat16", 128, 16, 4, rope=True),
    KernelSpec("decode_simt", "metal", "bfloat16", 128, 16, 4, k_bits=4, v_bits=4, group_size=32),
    QuantizeRowsSpec("metal", "bfloat16", 128, 4, 4, 32),
    GatedDeltaSpec("metal", "bfloat16", 16, 32, 128, 128),  # Qwen3.5's recurrence
    GatedDeltaSpec("metal", "bfloat16", 16, 16, 128, 128, 4),  # and its decode step
    # Expanded MLA's K 192 / V 128.
    KernelSpec("decode_simt", "metal", "bfloat16", 192, 16, 1, value_dim=128),
    # gemma2's window layers (soft-capped scores) and llama4's chunked layers.
    KernelSpec.parse("decode_simt_metal_bf16_hd256_bs16_g2_sw_sc"),
    KernelSpec.parse("decode_reduce_metal_bf16_hd128_bs32_g5_p512_ck"),
    # DeepSeek-V3's latent rows (512 + 64): MLA decode, pass 1 and the merge.
    LatentSpec.parse("latent_simt_metal_bf16_r512_p64_bs16"),
    LatentSpec.parse("latent_reduce_metal_bf16_r512_p64_bs16"),
    # `--lean-decode fused`'s layer kernels at a Qwen3 layer's shape.
    LayerKernelSpec.parse("add_rms_norm_metal_bf16"),
    LayerKernelSpec.parse("swiglu_metal_bf16"),
    LayerKernelSpec.parse("qkv_rope_metal_bf16_hd128_h32k8_qkn"),
    LayerKernelSpec.parse("qkv_rope_metal_bf16_hd128_h32k8_pages"),
]


@pytest.mark.parametrize("spec", GOLDEN_SPECS, ids=lambda s: s.name)
def test_sources_match_golden(spec):
    golden = GOLDEN / f"{spec.name}.metal"
    assert capture_metal_source(spec) == golden.read_text(), (
        f"{spec.name} changed; if intended, run tests/golden/update_golden.py and review"
    )


def test_representative_metal_specs_compile():
    specs = representative_specs("metal")
    assert {s.kernel for s in specs} == {"decode_simt", "decode_simt_splitk", "decode_reduce"}
    for spec in specs:
        check_metal_source(capture_metal_source(spec), spec.name)


def test_value_dim_metal_specs_compile():
    """V pages of their own head size: the outputs take it."""
    for spec in value_dim_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        assert f"constexpr int VALUE_DIM = {spec.value_dim};" in source


def test_score_rule_metal_specs_compile():
    """Soft-capped scores take a tanh; a chunk moves the first key to its chunk's start."""
    for spec in score_rule_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        assert ("pa_cap * tanh(" in source) == spec.softcap, spec.name
        assert ("- 1) / window[0] * window[0]" in source) == spec.chunked, spec.name


def test_quantized_metal_specs_compile():
    """The dequantizing kernels: K and V come in as one `uint32_t` array of rows."""
    for spec in quantized_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        assert "const device uint32_t* kv_pages [[buffer(" in source and "k_pages [[" not in source


def test_quantize_rows_metal_specs_compile():
    for spec in quantize_rows_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        assert "device uint32_t* rows [[buffer(" in source


def test_gated_delta_metal_specs_compile():
    for spec in gated_delta_specs("metal") + gated_delta_step_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        assert (
            "device float* state_out [[buffer(" in source
            and "const constant int64_t* state_strides" in source
        )


def test_latent_attention_metal_specs_compile():
    """MLA decode: the SIMT pass 1 stages each tile of latent rows in threadgroup memory."""
    for spec in latent_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        if spec.kernel != "reduce":
            assert "latent_pages [[buffer(" in source and "threadgroup T la_kv[" in source


def test_layer_kernel_metal_specs_compile():
    """The layer kernels read their inputs in place and write each output once."""
    for spec in layer_kernel_specs("metal"):
        source = capture_metal_source(spec)
        check_metal_source(source, spec.name)
        outputs = {"add_rms_norm": "normed", "swiglu": "out", "qkv_rope": "queries"}[spec.kind]
        assert f"device T* {outputs} [[buffer(" in source or f"{outputs} [[buffer(" in source


def test_captured_source_is_mlx_wrapping_of_our_body():
    source = capture_metal_source(SPEC)
    body = define(SPEC).source
    assert body.strip() in source
    assert (
        "[[kernel]] void custom_kernel_decode_simt_splitk_metal_bf16_hd128_bs16_g4_p512_sw"
        in source
    )
    # MLX added the attribute and stride arguments our body names, and nothing else.
    for arg in (
        "uint3 threadgroup_position_in_grid [[threadgroup_position_in_grid]]",
        "uint thread_index_in_simdgroup [[thread_index_in_simdgroup]]",
        "const constant int64_t* k_pages_strides",
        "const device int32_t* seq_lens",
        "const constant int32_t* window",
        "device float* partial_out",
    ):
        assert arg in source
    assert "k_pages_shape" not in source and "thread_position_in_grid" not in source
    assert "template [[host_name(" in source


def _capture_with_body(spec: KernelSpec, body: str) -> str:
    """MLX's wrapping of a modified body, captured the same way as the real one."""
    defn = define(spec)
    kernel = mx.fast.metal_kernel(
        name=spec.name + "_broken",
        input_names=list(defn.input_names),
        output_names=list(defn.output_names),
        source=body,
        header=defn.header,
        ensure_row_contiguous=False,
    )
    return capture_metal_source(spec, kernel=kernel)


@pytest.mark.parametrize(
    "breakage,replace,message",
    [
        ("a misspelt variable", ("o_all / l_all", "o_all / l_sum"), "undeclared identifier"),
        (
            "a CUDA builtin in Metal",
            ("threadgroup_barrier(mem_flags::mem_threadgroup)", "__syncthreads()"),
            "__syncthreads",
        ),
        (
            "an error that only instantiation for T finds",
            ("static_cast<T>(o_all / l_all)", "static_cast<T>(o_all / l_all).bits"),
            "no member named 'bits'",
        ),
        ("an ambiguous overload", ("max(pa_m[g], chunk_max)", "max(pa_m[g], pa_len)"), "ambiguous"),
    ],
)
def test_compile_check_rejects_a_broken_body(breakage, replace, message):
    spec = KernelSpec("decode_simt", "metal", "bfloat16", 128, 16, 4)
    body = define(spec).source
    assert replace[0] in body, breakage
    source = _capture_with_body(spec, body.replace(replace[0], replace[1]))
    with pytest.raises(MetalCheckError, match=message):
        check_metal_source(source, "broken")


def test_kernels_refuse_to_run_on_the_cpu():
    q = mx.zeros((1, 4, 1, 64))
    pages = mx.zeros((2, 16, 2, 64))
    with pytest.raises(UnsupportedSpecError, match="Metal or CUDA"):
        paged_attention_decode(q, pages, pages, mx.array([[1]]), mx.array([3]), scale=1.0)


def test_cli_renders_and_checks_a_metal_spec(capsys):
    from mlx_paged.cli.main import main

    assert main(["kernels", "render", "decode_simt_metal_bf16_hd128_bs16_g4", "--check"]) == 0
    out, err = capsys.readouterr()
    assert "[[kernel]] void custom_kernel_decode_simt_metal_bf16_hd128_bs16_g4" in out
    assert "clang compile check passed" in err
    assert main(["kernels", "render"]) == 2
    assert "give a spec name" in capsys.readouterr().err
