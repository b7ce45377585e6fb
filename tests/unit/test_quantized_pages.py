"""Quantized K/V pages: what a write stores is what `mx.quantize` makes of the values, the
bytes per token, and the settings refused with a reason."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.engine.config import EngineConfig
from mlx_paged.kernels.paged_attention_reference import gather_pages
from mlx_paged.kernels.quantized_pages import (
    QuantizedKVPages,
    check_kv_quantization,
    layer_bytes_per_token,
    row_layout,
)
from mlx_paged.kv.page_arrays import make_slot_mapping
from mlx_paged.kv.paged_cache import PagedKVPool


@pytest.mark.parametrize("bits,group", [(8, 32), (8, 64), (4, 32), (4, 64)])
def test_written_values_read_back_as_mlx_dequantizes_them(bits, group):
    pool = PagedKVPool(1, 6, 4, 2, 64, mx.bfloat16, k_bits=bits, v_bits=16, group_size=group)
    keys = mx.random.normal((1, 2, 5, 64), key=mx.random.key(bits + group)).astype(mx.bfloat16)
    values = keys + 1
    pool.write(0, keys, values, make_slot_mapping(list(range(8, 13))))  # blocks 2 and 3
    pages = pool.pages[0]
    got = gather_pages(pages.k, mx.array([[2, 3]]))[:, :, :5]
    want = mx.dequantize(*mx.quantize(keys, group_size=group, bits=bits), group_size=group,
                         bits=bits)  # fmt: skip
    np.testing.assert_array_equal(got.astype(mx.float32), want.astype(mx.float32))
    assert isinstance(pages, QuantizedKVPages) and pages.k.shape == (6, 4, 2, 64)
    # V stays in the model's dtype, exactly.
    v = gather_pages(pages.v, mx.array([[2, 3]]))[:, :, :5]
    np.testing.assert_array_equal(v.astype(mx.float32), values.astype(mx.float32))


def test_rows_hold_k_values_v_values_then_scales_and_biases():
    # bf16, head dim 128, 4 bits in groups of 32: 64 + 64 bytes of values, 4 groups a part.
    assert row_layout(128, 2, 4, 4, 32) == (0, 64, 128, 136, 144, 152, 160, 160)
    # 8-bit K, 16-bit V: V keeps the model's dtype and has no scales; padded to 16 bytes for
    # its vector loads. Two quantized sides need only 8 (the kernels' widest load there).
    assert row_layout(64, 2, 8, 16, 64) == (0, 64, 192, 194, None, None, 196, 208)
    assert (
        row_layout(64, 2, 8, 8, 64).row_bytes == 136 and row_layout(64, 2, 8, 8, 64).alignment == 8
    )
    assert row_layout(128, 2, 4, 4, 32).alignment == 16
    keys = mx.random.normal((3, 2, 64), key=mx.random.key(1)).astype(mx.bfloat16)
    values = keys * 2
    pages = QuantizedKVPages.from_values(keys, values, 8, 16, 64)
    words = np.array(pages.rows.view(mx.uint8))
    packed, scales, biases = mx.quantize(keys, group_size=64, bits=8)
    np.testing.assert_array_equal(words[..., :64], np.array(packed.view(mx.uint8)))
    np.testing.assert_array_equal(words[..., 64:192], np.array(values.view(mx.uint8)))
    np.testing.assert_array_equal(words[..., 192:194], np.array(scales.view(mx.uint8)))
    np.testing.assert_array_equal(words[..., 194:196], np.array(biases.view(mx.uint8)))
    assert not words[..., 196:].any()


@pytest.mark.parametrize("bits", [8, 4])
def test_latent_rows_quantize_the_latent_and_the_rope_keys_each_at_its_own_size(bits):
    """Latent pages: K is the latent (512), V the RoPE keys (64), one row a token."""
    pool = PagedKVPool(1, 4, 4, 1, 512, mx.bfloat16, bits, bits, 64, [(1, 512, 64)])
    latent = mx.random.normal((1, 1, 3, 512), key=mx.random.key(bits)).astype(mx.bfloat16)
    rope = mx.random.normal((1, 1, 3, 64), key=mx.random.key(9)).astype(mx.bfloat16)
    pool.write(0, latent, rope, make_slot_mapping([4, 5, 6]))  # block 1
    pages = pool.pages[0]
    # 576 values at `bits`, and 9 groups of 64 with a bf16 scale and bias each; 8-byte rows.
    assert pages.rows.shape[-1] * 4 == -(-(576 * bits // 8 + 9 * 4) // 8) * 8
    assert pages.k.shape == (4, 4, 1, 512) and pages.v.shape == (4, 4, 1, 64)
    for side, x in ((pages.k, latent), (pages.v, rope)):
        got = gather_pages(side, mx.array([[1]]))[:, :, :3]
        want = mx.dequantize(*mx.quantize(x, group_size=64, bits=bits), group_size=64,
                             bits=bits)  # fmt: skip
        np.testing.assert_array_equal(got.astype(mx.float32), want.astype(mx.float32))
    row_bytes = pages.rows.shape[-1] * 4
    assert layer_bytes_per_token(1, 512, mx.bfloat16, bits, bits, 64, 64) == row_bytes


def test_bytes_per_token_count_values_scales_biases_and_row_padding():
    assert layer_bytes_per_token(8, 64, mx.bfloat16, 16, 16, 64) == 2 * 8 * 64 * 2
    assert layer_bytes_per_token(8, 64, mx.bfloat16, 8, 8, 64) == 8 * 2 * (64 + 2 * 1 * 2)
    assert layer_bytes_per_token(8, 128, mx.bfloat16, 4, 4, 32) == 8 * 2 * (64 + 2 * 4 * 2)
    assert layer_bytes_per_token(8, 64, mx.bfloat16, 4, 4, 64) == 8 * 72
    assert layer_bytes_per_token(8, 64, mx.bfloat16, 16, 4, 64) == 8 * 176  # 164, padded
    assert layer_bytes_per_token(8, 192, mx.bfloat16, 16, 16, 64, 128) == 8 * (192 + 128) * 2
    # Latent rows: a 512 latent and 64 RoPE keys, at 8 bits in groups of 64 (616 bytes).
    assert layer_bytes_per_token(1, 512, mx.bfloat16, 8, 8, 64, 64) == 616
    pool = PagedKVPool(3, 10, 16, 8, 64, mx.bfloat16, k_bits=8, v_bits=4, group_size=32)
    per_token = 3 * layer_bytes_per_token(8, 64, mx.bfloat16, 8, 4, 32)
    assert per_token == 3 * 8 * (64 + 32 + 4 * 2 * 2)
    assert pool.nbytes == 10 * 16 * per_token


def test_settings_the_pages_cannot_take_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="take 16, 8, 4 bits, not 6"):
        check_kv_quantization(6, 16, 64, 64)
    with pytest.raises(ValueError, match="32 or 64"):
        check_kv_quantization(8, 8, 128, 64)
    with pytest.raises(ValueError, match="head dim .96. is not a multiple.*--kv-group-size 32"):
        check_kv_quantization(8, 8, 64, 96)
    with pytest.raises(ValueError, match="head dim .16. is not a multiple.*--kv-bits 16"):
        check_kv_quantization(8, 8, 32, 16)
    check_kv_quantization(16, 16, 64, 96)  # unquantized pages take any head dim
    with pytest.raises(ValueError, match="BatchKVCache has no to_quantized"):
        EngineConfig(kv_paged=False, kv_bits=8)
    with pytest.raises(ValueError, match="kv_bits_v must be one of"):
        EngineConfig(kv_bits_v=2)
    config = EngineConfig(kv_bits=8, kv_bits_v=4)
    assert (config.k_bits, config.v_bits) == (8, 4)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64), (8, 32)])
def test_values_unpack_from_the_low_bits_as_the_kernels_read_them(bits, group):
    """The dequantizing kernels take value j of a lane's slice from word j / (32 / bits) at
    bit (j % (32 / bits)) * bits, then scale * q + bias: MLX's packing, checked here."""
    values = mx.random.normal((3, 128), key=mx.random.key(bits))
    packed, scales, biases = mx.quantize(values, group_size=group, bits=bits)
    words = np.array(packed, dtype=np.uint64)
    per_word = 32 // bits
    j = np.arange(128)
    shifts = ((j % per_word) * bits).astype(np.uint64)
    q = (words[:, j // per_word] >> shifts) & np.uint64(2**bits - 1)
    got = np.array(scales)[:, j // group] * q + np.array(biases)[:, j // group]
    np.testing.assert_allclose(got, np.array(mx.dequantize(packed, scales, biases, group, bits)),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
