"""The dequantizing kernels' specs: names, refusals, and the geometry of their lanes, tensor-core
registers and rings (pure Python)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from mlx_paged.kernels.catalog import quantized_specs
from mlx_paged.kernels.kernel_spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_geometry import define, geometry, ring_slot_bytes


def test_quantized_specs_name_their_bits_and_parse_back():
    for backend in ("metal", "cuda"):
        specs = quantized_specs(backend)
        pairs = {(s.k_bits, s.v_bits) for s in specs}
        assert pairs == {(8, 8), (4, 4), (8, 4), (4, 8), (16, 4), (8, 16)}
        assert {s.group_size for s in specs} == {32, 64}
        for s in specs:
            assert s.quantized and f"_k{s.k_bits}v{s.v_bits}gs{s.group_size}" in s.name
            assert KernelSpec.parse(s.name) == s
    assert not KernelSpec.parse("decode_simt_cuda_bf16_hd128_bs16_g4").quantized


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(kernel="decode_tc", backend="cuda", v_bits=16), "both sides quantized or both"),
        (dict(rope=True), "RoPE kernels write 16-bit pages"),
        (dict(kernel="decode_reduce", partition_size=512), "reduce pass reads no pages"),
        (dict(head_dim=96), "lanes of 8 values need head_dim"),
        (dict(group_size=16), "groups of (32, 64)"),
        (dict(k_bits=2), "take (16, 8, 4) bits"),
        (dict(k_bits=16, v_bits=16), "16-bit pages take no group size"),
    ],
)
def test_quantized_specs_refuse_what_no_kernel_dequantizes(kwargs, message):
    args = dict(kernel="decode_simt", backend="metal", dtype="bfloat16", head_dim=128,
                block_size=16, gqa=4, k_bits=4, v_bits=4, group_size=32) | kwargs  # fmt: skip
    with pytest.raises(UnsupportedSpecError, match=re.escape(message)):
        KernelSpec(**args)


def test_quantized_lanes_read_eight_values_from_one_array_of_rows():
    spec = KernelSpec("decode_simt_splitk", "cuda", "bfloat16", 128, 16, 4, 512, True,
                      k_bits=8, v_bits=4, group_size=32)  # fmt: skip
    geo = geometry(spec)
    assert (geo.tpr, geo.epl) == (16, 8)
    defn = define(spec)
    assert defn.input_names == ("queries", "kv_pages", "block_tables", "seq_lens", "scale",
                                "window")  # fmt: skip
    # Each part of a row (0, 64, 192, 200, 208, 212: 8-bit K, 4-bit V, bf16 scales) is read
    # through a pointer and strides of its own; T-typed parts count strides in T.
    assert "const uint32_t* v_pages = reinterpret_cast<const uint32_t*>(kv_pages) + 32;" in (
        defn.source
    )
    assert "const T* k_biases = reinterpret_cast<const T*>(kv_pages) + 100;" in defn.source
    assert "k_biases_strides[3] = {kv_pages_strides[0] * 2," in defn.source
    # 8-bit K: two words a lane, masked by 255; 4-bit V: one word, by 15.
    assert "EPL * 8 / 32" in defn.source and "255u" in defn.source and "15u" in defn.source
    plain = define(KernelSpec("decode_simt", "cuda", "bfloat16", 128, 16, 4, k_bits=16,
                              v_bits=4, group_size=64))  # fmt: skip
    assert "const T* k_pages" in plain.source and "k_scales" not in plain.source
    assert "const T* v_scales = reinterpret_cast<const T*>(kv_pages) + 160;" in plain.source


def test_tensor_core_registers_take_packed_slices_a_group_each():
    """On the register path a lane's K slice (32 values at head dim 128) is 16 bytes at 4 bits
    and its V slice (16 values) 8 bytes, each with one scale and bias; 16-bit sides keep the
    plain loads."""
    spec = KernelSpec("decode_tc_splitk_direct", "cuda", "bfloat16", 128, 16, 4, 1024,
                      k_bits=4, v_bits=4, group_size=32)  # fmt: skip
    source, header = define(spec).source, define(spec).header
    assert "reinterpret_cast<uint4*>(kq[u][n])" in source
    assert "reinterpret_cast<uint2*>(vq[u][r])" in source
    assert "KQ * mm_t / 32" in source and "NT * mm_g / 32" in source  # the lane's group
    # 4-bit values dequantize two at a time (a word's q_k and q_k+4) through 2^7 + q in bf16,
    # straight into the mma's registers: K pairs in the order the query fragments take (dims
    # 8w + k and 4 up), V pairs of two rows' values interleaved by byte.
    assert "mlx_paged_dequant2(kq[u][i][w], k * 4, 0x000f000fu, k_scale[u][i]" in source
    assert "0x43004300u" in header and "lop3.b32" in header and "kd[i][4 * w + k] =" in source
    assert "const int dim = KQ * mm_t + 8 * ((2 * s + h) / 4) + (2 * s + h) % 4;" in source
    assert "queries[qoff + int64_t(dim + 4)" in source
    assert "__byte_perm(vq[u][2 * rp][w], vq[u][2 * rp + 1][w]" in source
    # Both sides two values a step: K and V are the mma's A operand, P (transposed) its B.
    assert "mlx_paged_mma(mm_o[j], vd[0][2 * j], vd[0][2 * j + 1], vd[1][2 * j]" in source
    assert "movmatrix.sync.aligned.m8n8.trans.b16" in header
    half = KernelSpec("decode_tc_splitk_direct", "cuda", "float16", 128, 16, 4, 1024,
                      k_bits=16, v_bits=8, group_size=64)  # fmt: skip
    source = define(half).source
    assert "const T (&kd)[2][KQ] = kr[u];" in source and "k_scales" not in source
    assert "reinterpret_cast<uint4*>(vq[u][r])" in source
    assert "mlx_paged_dequant2_rows(x, k * 8, 0x00ff00ffu, s2, b2" in source  # 2^10 + q in fp16
    assert "queries[qoff + int64_t(dim + 1)" in source  # 16-bit K: the plain dim order
    # bf16 cannot hold 2^7 + q for 8-bit q: those dequantize one at a time through fp32.
    bf16 = KernelSpec("decode_tc_splitk_direct", "cuda", "bfloat16", 128, 16, 4, 1024,
                      k_bits=8, v_bits=8, group_size=64)  # fmt: skip
    source = define(bf16).source
    assert "mlx_paged_dequant2(" not in source and "255u" in source
    assert "kd[i][e] = static_cast<T>(k_scale[u][i] * static_cast<float>(q)" in source
    # Rows of 136 bytes (head dim 64, 8-bit, groups of 64) start 8-byte aligned: the 16-byte K
    # slice loads in two 8-byte pieces.
    narrow = define(KernelSpec("decode_tc_splitk_direct", "cuda", "bfloat16", 64, 16, 4, 1024,
                               k_bits=8, v_bits=8, group_size=64))  # fmt: skip
    assert "reinterpret_cast<const uint2*>(k_pages + mq_row)[vi]" in narrow.source
    assert "uint4" not in narrow.source.split("kq[u][n]")[1][:200]


def test_quantized_ring_takes_one_sub_page_a_step_where_two_do_not_fit():
    """fp16 8-bit rows of head dim 128 (288 bytes) under the swapped math: the wide kernel's
    8 simdgroups cannot hold 3 slots of two sub-pages each (about 233 KB), so its ring takes
    one sub-page a step and renders; `decode_tc`'s 4 simdgroups keep two."""
    wide = KernelSpec("decode_tc_wide", "cuda", "float16", 128, 16, 4, 0, k_bits=8, v_bits=8,
                      group_size=32)  # fmt: skip
    assert wide.ring_subpages == 2 and geometry(wide).ring_subpages == 1
    defn = define(wide)
    assert "constexpr int QSUB = 1;" in defn.source
    assert defn.ring_bytes == 8 * 3 * ring_slot_bytes(wide, 16, 1)
    narrow = dataclasses.replace(wide, kernel="decode_tc")
    assert geometry(narrow).ring_subpages == 2
    assert "constexpr int QSUB = 2;" in define(narrow).source


def test_quantized_ring_slot_holds_whole_page_rows_at_a_padded_stride():
    """A slot of the quantized ring: 16 whole page rows of this KV head (160 bytes at head dim
    128, 4 bits, groups of 32), copied by cp.async in 16-byte pieces to rows 176 bytes apart,
    and read back into the register path's slices."""
    spec = KernelSpec("decode_tc_splitk", "cuda", "bfloat16", 128, 16, 4, 1024, k_bits=4,
                      v_bits=4, group_size=32)  # fmt: skip
    defn = define(spec)
    assert spec.row_layout.row_bytes == 160 and spec.ring_row_stride == 176
    assert spec.ring_subpages == 2  # the swapped math takes two sub-pages a step
    assert ring_slot_bytes(spec) == 2 * 16 * 176
    assert defn.ring_bytes == 4 * 3 * ring_slot_bytes(spec)  # 4 simdgroups, 3 slots each
    assert (
        "constexpr int CW = 16;" in defn.source and "constexpr int NCH = 160 / CW;" in defn.source
    )
    assert "mlx_paged_cp_async_at<CW>(" in defn.source and "cp.async.ca" in defn.header
    assert "reinterpret_cast<uint4*>(kq[0][i])[vi]" in defn.source
    assert "mlx_paged_dequant2(kq[0][i][w], k * 4, 0x000f000fu" in defn.source
    # Queries and outputs take the register path's dim order, not ldmatrix's.
    assert "const int dim = KQ * mm_t + 8 * ((2 * s + h) / 4)" in defn.source
    assert "ldmatrix" not in defn.header
