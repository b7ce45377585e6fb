"""The dequantizing decode kernels (SIMT, and on CUDA the tensor-core register path and ring)
on quantized pages against the pure-MLX reference over the same pages dequantized, on the GPU."""

from __future__ import annotations

import mlx.core as mx
import pytest
from paged_cases import TOLERANCE, make_case, max_error, reference

from mlx_paged.bench.problems import head_major_view
from mlx_paged.kernels.catalog import quantized_specs
from mlx_paged.kernels.paged_attention import current_backend, paged_attention_decode
from mlx_paged.kernels.quantized_pages import QuantizedKVPages

pytestmark = pytest.mark.gpu

_DTYPES = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}


def _quantize(k_pages: mx.array, v_pages: mx.array, k_bits: int, v_bits: int, group: int):
    """Both sides as one `QuantizedKVPages`, and each side's values as the kernels see them."""
    kv = QuantizedKVPages.from_values(k_pages, v_pages, k_bits, v_bits, group)
    return (kv.k, kv.v), (kv.k.dequantize(), kv.v.dequantize())


def _check(dtype, head_dim, block_size, gqa, window, bits, kernel=None):
    k_bits, v_bits, group = bits
    lens = [1, block_size * 3 + 5, 1301, 512, 1537, 2049]
    queries, k_pages, v_pages, tables, seq_lens = make_case(
        3, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    (k_quant, v_quant), (k_values, v_values) = _quantize(k_pages, v_pages, k_bits, v_bits, group)
    scale = head_dim**-0.5
    ref = reference(queries, k_values, v_values, tables, seq_lens, scale, window)
    out = paged_attention_decode(queries, k_quant, v_quant, tables, seq_lens, scale=scale,
                                 window=window, kernel=kernel)  # fmt: skip
    assert out.dtype == dtype and out.shape == queries.shape
    assert max_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("spec", quantized_specs("cuda"), ids=lambda s: s.name)
def test_each_quantized_spec_matches_reference(spec):
    """The sample covers every bits pair, group size, head size, dtype, block size and
    window flag; the backend renders it for this GPU."""
    if current_backend() is None:
        pytest.skip("needs MLX's Metal or CUDA backend")
    window = 100 if spec.sliding_window else None
    _check(_DTYPES[spec.dtype], spec.head_dim, spec.block_size, spec.gqa, window,
           (spec.k_bits, spec.v_bits, spec.group_size), spec.kernel)  # fmt: skip


@pytest.mark.parametrize("bits", [(4, 4, 32), (8, 8, 64), (8, 4, 32)])
def test_routed_kernels_on_llama_shapes(bits):
    """What the engine runs for a llama (bf16, head dim 128, GQA 4, blocks of 16)."""
    _check(mx.bfloat16, 128, 16, 4, None, bits)
    _check(mx.bfloat16, 64, 16, 4, None, bits)


@pytest.mark.parametrize("kernel", [None, "decode_tc", "decode_tc_splitk_direct", "decode_simt"])
def test_head_major_quantized_rows_are_read_through_their_strides(kernel):
    """Rows stored `[Hkv, block, row]` and passed as their `[block, Hkv, row]` view (the kernel
    benchmark's `--head-major-pages` with `--kv-bits`) give the same attention: the ring and
    the register path read rows through the strides they are given."""
    if current_backend() is None:
        pytest.skip("needs MLX's Metal or CUDA backend")
    queries, k_pages, v_pages, tables, seq_lens = make_case(
        11, [1, 53, 1301, 4097], num_kv_heads=8, gqa=4, head_dim=128, block_size=16,
        dtype=mx.bfloat16,
    )  # fmt: skip
    kv = QuantizedKVPages.from_values(k_pages, v_pages, 4, 4, 32)
    view = kv._replace(rows=head_major_view(kv.rows))
    ref = reference(queries, kv.k.dequantize(), kv.v.dequantize(), tables, seq_lens, 0.088, None)
    out = paged_attention_decode(queries, view.k, view.v, tables, seq_lens, scale=0.088,
                                 kernel=kernel)  # fmt: skip
    assert max_error(out, ref) <= TOLERANCE[mx.bfloat16]


@pytest.mark.parametrize("block_size", [16, 32])
def test_wide_ring_on_fp16_eight_bit_rows_takes_one_sub_page_a_step(block_size):
    """fp16 8-bit rows at head dim 128 and groups of 32: two sub-pages' rings would not fit in
    shared memory, so the wide kernel renders with one sub-page a step and still matches."""
    if current_backend() != "cuda":
        pytest.skip("the wide tensor-core kernel is CUDA only")
    _check(mx.float16, 128, block_size, 4, None, (8, 8, 32), "decode_tc_wide")
