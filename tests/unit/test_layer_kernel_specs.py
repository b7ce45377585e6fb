"""Layer kernel specs (names, refusals) and the MLX references their launchers run off the GPU,
which must be exactly mlx-lm's ops."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.activations import swiglu as mlx_lm_swiglu

from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.layer_kernels import (
    LayerKernelSpec,
    add_rms_norm,
    define,
    layer_kernel_specs,
    qkv_rope,
    swiglu,
)


@pytest.mark.parametrize("backend", ["metal", "cuda"])
def test_names_round_trip(backend):
    specs = layer_kernel_specs(backend)
    assert {s.kind for s in specs} == {"add_rms_norm", "swiglu", "qkv_rope"}
    for spec in specs:
        assert LayerKernelSpec.parse(spec.name) == spec
    assert LayerKernelSpec.parse(f"qkv_rope_{backend}_bf16_hd128_h32k8_qkn").qk_norm


@pytest.mark.parametrize(
    "bad",
    ["swiglu_cuda_bf16_hd64", "qkv_rope_cuda_bf16_hd64", "qkv_rope_cuda_bf16_hd64_h32k8_x",
     "rms_cuda_bf16", "swiglu_vulkan_bf16", "swiglu_cuda_int8"],
)  # fmt: skip
def test_bad_names_are_refused_naming_the_format(bad):
    with pytest.raises(UnsupportedSpecError, match="layer kernel"):
        LayerKernelSpec.parse(bad)


def test_unknown_dtypes_and_backends_are_refused_naming_the_spec():
    with pytest.raises(UnsupportedSpecError, match="swiglu_cuda_int8: not a layer kernel"):
        LayerKernelSpec("swiglu", "cuda", "int8")
    with pytest.raises(UnsupportedSpecError, match="swiglu_vulkan_f16"):
        LayerKernelSpec("swiglu", "vulkan", "float16")


def test_head_layouts_belong_to_qkv_rope_only():
    with pytest.raises(UnsupportedSpecError, match="only qkv_rope"):
        LayerKernelSpec("swiglu", "cuda", "bfloat16", head_dim=64)
    with pytest.raises(UnsupportedSpecError, match="GQA"):
        LayerKernelSpec("qkv_rope", "cuda", "bfloat16", 64, 12, 5)


def test_definitions_name_their_arguments():
    spec = LayerKernelSpec("qkv_rope", "cuda", "bfloat16", 128, 32, 8, qk_norm=True)
    defn = define(spec)
    assert defn.input_names == ("qkv", "positions", "rope_inv_freq", "q_norm", "k_norm", "eps")
    assert defn.output_names == ("queries", "keys", "values")
    assert define(LayerKernelSpec("add_rms_norm", "metal", "float16")).output_names == (
        "total",
        "normed",
    )


def test_references_are_mlx_lms_ops():
    h, r = mx.random.normal((3, 64)), mx.random.normal((3, 64))
    weight = mx.random.normal((64,))
    total, normed = add_rms_norm(h, r, weight, 1e-5, None)
    assert mx.array_equal(total, h + r).item()
    assert mx.array_equal(normed, mx.fast.rms_norm(h + r, weight, 1e-5)).item()
    gate_up = mx.random.normal((3, 256))
    want = mlx_lm_swiglu(gate_up[:, :128], gate_up[:, 128:])
    assert mx.array_equal(swiglu(gate_up, None), want).item()


def test_qkv_rope_has_no_cpu_form():
    """The caller runs the model's own norms and RoPE off the GPU (`lean_fused.py`)."""
    with pytest.raises(UnsupportedSpecError):
        qkv_rope(mx.zeros((1, 6 * 64)), mx.zeros((1,), mx.int32), mx.zeros((32,)), (4, 1, 64),
                 None)  # fmt: skip


def test_add_rms_norm_refuses_mixed_dtypes_before_any_kernel():
    """A kernel of one T would read a float32 update as bf16: refused, naming the dtypes."""
    h, r = mx.zeros((2, 64), mx.bfloat16), mx.zeros((2, 64), mx.float32)
    with pytest.raises(UnsupportedSpecError, match="share one dtype"):
        add_rms_norm(h, r, mx.ones((64,), mx.bfloat16), 1e-5, "cuda")


def test_qkv_rope_refuses_norm_weights_of_another_dtype():
    qkv = mx.zeros((1, 6 * 64), mx.bfloat16)
    norms = (mx.ones((64,), mx.float32), mx.ones((64,), mx.float32), 1e-6)
    with pytest.raises(UnsupportedSpecError, match="norm weights must be"):
        qkv_rope(qkv, mx.zeros((1,), mx.int32), mx.zeros((32,)), (4, 1, 64), "cuda", norms)
