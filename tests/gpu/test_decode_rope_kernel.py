"""The `decode_rope_*` kernels (RoPE and the new token inside attention) against their
pure-MLX reference, on the GPU: every pass-1 kernel, ragged lengths, windows, partial rotary."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from paged_cases import make_case, max_error

from mlx_paged.kernels.paged_attention import paged_attention_decode_rope
from mlx_paged.kernels.paged_attention_reference import paged_attention_decode_rope_reference

pytestmark = pytest.mark.gpu

BF16, F16, F32 = mx.bfloat16, mx.float16, mx.float32
# float32 is looser than for the plain kernels: an angle of thousands of radians rounded to
# float32 is off by up to 2.4e-4 rad, and the reference rounds it differently (it inverts the
# frequencies twice through mx.fast.rope's `freqs`).
TOLERANCE = {F32: 1e-3, BF16: 2e-2, F16: 5e-3}
SIMT = ("decode_simt", "decode_simt_splitk")
TENSOR_CORES = ("decode_tc", "decode_tc_wide", "decode_tc_splitk", "decode_tc_splitk_direct")
# (dtype, head_dim, block_size, gqa, window, rotated dims)
CASES = [
    (BF16, 128, 16, 4, None, 128),
    (BF16, 64, 16, 4, None, 64),
    (F16, 128, 32, 8, 100, 128),
    (BF16, 64, 16, 2, None, 32),  # partial rotary: half the dims turn
    (F32, 80, 8, 3, None, 80),
    (F32, 64, 16, 1, 37, 64),
    (BF16, 96, 8, 6, None, 96),
]


def _id(case):
    dtype, d, bs, g, window, dims = case
    return f"{str(dtype).split('.')[-1]}-hd{d}-bs{bs}-g{g}-r{dims}" + (
        f"-sw{window}" if window else ""
    )


def _reference(args, scale, freqs, window):
    with mx.stream(mx.cpu):
        out, rotated = paged_attention_decode_rope_reference(
            *(a.astype(mx.float32) if a.dtype in (BF16, F16) else a for a in args),
            scale=scale, rope_inv_freq=freqs, window=window,
        )  # fmt: skip
        mx.eval(out, rotated)
    return out, rotated


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_every_rope_kernel_matches_the_reference(case):
    dtype, head_dim, block_size, gqa, window, dims = case
    # The new token's position is len - 1: one token alone, a block boundary, a partition
    # boundary (513, 1025, 2049 put it first in a partition), long rows.
    lens = [1, block_size + 1, block_size * 3 + 5, 513, 1025, 1301, 2049, 4100]
    queries, k_pages, v_pages, tables, seq_lens = make_case(
        3, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    rng = np.random.default_rng(5)
    new = (len(lens), 2, 1, head_dim)
    keys = mx.array(rng.standard_normal(new, np.float32)).astype(dtype)
    values = mx.array(rng.standard_normal(new, np.float32)).astype(dtype)
    freqs = mx.array(500000.0 ** -(np.arange(0, dims, 2) / dims), dtype=mx.float32)
    scale = head_dim**-0.5
    args = (queries, keys, values, k_pages, v_pages, tables, seq_lens)
    ref_out, ref_rotated = _reference(args, scale, freqs, window)
    tensor_cores = dtype != F32 and head_dim in (64, 128) and block_size % 16 == 0
    for kernel in (None,) + SIMT + (TENSOR_CORES if tensor_cores else ()):
        out, rotated = paged_attention_decode_rope(
            *args, scale=scale, rope_inv_freq=freqs, window=window, kernel=kernel
        )
        assert out.shape == queries.shape and rotated.shape == keys.shape
        # The rotated key is RoPE's output rounded to the page dtype, as MLX's rope gives it.
        assert max_error(rotated, ref_rotated) <= TOLERANCE[dtype], f"{kernel}: rotated key"
        err = max_error(out, ref_out)
        assert err <= TOLERANCE[dtype], f"{kernel}: max abs error {err}"
