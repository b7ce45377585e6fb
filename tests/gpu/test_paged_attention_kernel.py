"""The generated paged decode kernels against the pure-MLX reference, on the GPU."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from paged_cases import TOLERANCE, make_case, max_error, reference

from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention import paged_attention_decode

pytestmark = pytest.mark.gpu

BF16, F16, F32 = mx.bfloat16, mx.float16, mx.float32
# (dtype, head_dim, block_size, gqa, sliding window): every supported value appears at least once.
SPECS = (
    [(BF16, 128, 16, g, None) for g in range(1, 9)]
    + [(F16, 128, 16, 4, None), (F32, 128, 16, 4, None)]
    + [(BF16, d, 16, 4, None) for d in (64, 80, 96, 256)]
    + [(BF16, 256, 16, 8, None)]
    + [(BF16, 128, 8, 4, None), (BF16, 128, 32, 4, None)]
    + [
        (F32, 80, 8, 3, None),
        (F16, 96, 32, 5, None),
        (F32, 256, 16, 8, None),
        (F16, 64, 32, 1, None),
        (F32, 64, 16, 7, None),
        (BF16, 96, 8, 6, None),
    ]
    + [(BF16, 128, 16, 4, 100), (F32, 64, 8, 2, 37), (F16, 80, 32, 8, 700)]
    # Gemma 4's global layers: head size 512.
    + [(BF16, 512, 16, 2, None), (F16, 512, 16, 8, 100), (F32, 512, 8, 1, None)]
)


def _id(case):
    dtype, d, bs, g, window = case
    return f"{str(dtype).split('.')[-1]}-hd{d}-bs{bs}-g{g}" + (f"-sw{window}" if window else "")


SIMT = ("decode_simt", "decode_simt_splitk")
TENSOR_CORES = ("decode_tc", "decode_tc_wide", "decode_tc_splitk", "decode_tc_splitk_direct")


def _tensor_cores_serve(case) -> bool:
    dtype, head_dim, block_size, _, _ = case
    return dtype != F32 and head_dim in (64, 128) and block_size % 16 == 0


def _assert_kernels_match(inputs, ref, kernels, dtype=BF16, scale=0.088, window=None):
    """Each of `kernels`, forced on `inputs`, matches `ref`."""
    for kernel in kernels:
        out = paged_attention_decode(*inputs, scale=scale, window=window, kernel=kernel)
        assert out.dtype == dtype and out.shape == inputs[0].shape
        err = max_error(out, ref)
        assert err <= TOLERANCE[dtype], f"{kernel}: max abs error {err}"


@pytest.mark.parametrize("case", SPECS, ids=_id)
def test_every_kernel_matches_reference(case):
    dtype, head_dim, block_size, gqa, window = case
    # Ragged: one token, a partly filled block, an exact multiple of the block, several
    # partitions, a partition boundary.
    lens = [1, block_size * 3 + 5, block_size * 8, 1301, 512, 1537, 2049]
    inputs = make_case(
        7, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim, block_size=block_size, dtype=dtype
    )
    scale = head_dim**-0.5
    ref = reference(*inputs, scale, window)
    kernels = SIMT + (TENSOR_CORES if _tensor_cores_serve(case) else ())
    _assert_kernels_match(inputs, ref, (None,) + kernels, dtype, scale, window)


# (dtype, K head size, V head size, block size, gqa, window): expanded MLA's 192/128 and
# mimo_v2_flash's window layers among them.
VALUE_DIM_CASES = [
    (BF16, 192, 128, 16, 1, None),
    (BF16, 192, 128, 32, 8, 100),
    (F16, 192, 128, 16, 4, None),
    (F32, 128, 64, 8, 2, None),
    (F16, 64, 128, 16, 3, 37),
]


@pytest.mark.parametrize("case", VALUE_DIM_CASES, ids=str)
def test_v_heads_of_their_own_size_match_reference(case):
    dtype, head_dim, value_dim, block_size, gqa, window = case
    lens = [1, block_size * 3 + 5, 1301, 512, 2049]
    inputs = make_case(5, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                       block_size=block_size, dtype=dtype, value_dim=value_dim)  # fmt: skip
    scale = head_dim**-0.5
    ref = reference(*inputs, scale, window)
    assert ref.shape == (len(lens), 2 * gqa, 1, value_dim)
    for kernel in (None, *SIMT):
        out = paged_attention_decode(*inputs, scale=scale, window=window, kernel=kernel)
        assert out.dtype == dtype and out.shape == ref.shape
        err = max_error(out, ref)
        assert err <= TOLERANCE[dtype], f"{kernel}: max abs error {err}"


# (dtype, head size, block size, gqa, window, chunk, cap): gemma2's cap of 50 (with its window
# layers' window too), a cap of 5 that bends most scores, and llama4's chunks (8192 tokens as
# released, and chunks that cut the ragged rows' contexts).
SCORE_RULE_CASES = [
    (BF16, 256, 16, 2, None, None, 50.0),
    (BF16, 256, 16, 2, 100, None, 50.0),
    (F32, 128, 16, 4, None, None, 5.0),
    (BF16, 128, 16, 5, None, 8192, None),
    (F16, 128, 32, 5, None, 300, None),
    (F32, 64, 8, 2, None, 7, 20.0),
]


@pytest.mark.parametrize("case", SCORE_RULE_CASES, ids=str)
def test_soft_capped_and_chunked_scores_match_reference(case):
    dtype, head_dim, block_size, gqa, window, chunk, softcap = case
    lens = [1, block_size * 3 + 5, 1301, 512, 2049]
    inputs = make_case(5, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                       block_size=block_size, dtype=dtype)  # fmt: skip
    scale = head_dim**-0.5
    ref = reference(*inputs, scale, window, chunk=chunk, softcap=softcap)
    for kernel in (None, *SIMT):
        out = paged_attention_decode(*inputs, scale=scale, window=window, chunk=chunk,
                                     softcap=softcap, kernel=kernel)  # fmt: skip
        assert out.dtype == dtype and out.shape == ref.shape
        err = max_error(out, ref)
        assert err <= TOLERANCE[dtype], f"{kernel}: max abs error {err}"


@pytest.mark.parametrize("batch", [1, 3, 64, 256])
def test_batch_sizes(batch):
    rng = np.random.default_rng(batch)
    lens = [int(n) for n in rng.integers(1, 700, size=batch)]
    inputs = make_case(batch, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16, dtype=BF16)
    _assert_kernels_match(inputs, reference(*inputs, 0.088), (None,) + SIMT + TENSOR_CORES)


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_long_context_32k(dtype):
    lens = [32768, 20001, 4097]
    inputs = make_case(9, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16, dtype=dtype)
    kernels = (None,) + SIMT + (TENSOR_CORES if dtype != F32 else ())
    _assert_kernels_match(inputs, reference(*inputs, 0.088), kernels, dtype)


@pytest.mark.parametrize("partition_size", [1024, 2048, 4096])
def test_fused_split_k_calls_in_one_graph(partition_size):
    """Fused split-K calls built into one graph with no data dependency between them: each
    counts on the counters the call before zeroed (`CounterChain`), including across a chain
    that grows past 256 (sequence, KV head) groups; every answer stays exact (sliding windows
    that skip partitions included)."""
    calls = []
    wide = [int(n) for n in np.random.default_rng(6).integers(1, 9000, size=40)]
    for seed, lens, window in (
        (3, [1, 700, 5100], None),
        (4, [4097, 33, 900, 9500], None),
        (5, [13000, 129], 300),
        (6, wide, None),
        (7, wide[:9], 2000),
        (3, [1, 700, 5100], None),
    ):
        inputs = make_case(
            seed, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16, dtype=BF16
        )
        for kernel in ("decode_tc_splitk_direct",) + (
            ("decode_tc_splitk",) if partition_size == 1024 else ()
        ):
            out = paged_attention_decode(
                *inputs, scale=0.088, window=window, kernel=kernel, partition_size=partition_size
            )
            calls.append((out, reference(*inputs, 0.088, window)))
    mx.eval([out for out, _ in calls])  # one graph: the launches run back to back
    for out, ref in calls:
        assert max_error(out, ref) <= TOLERANCE[BF16]


@pytest.mark.parametrize(
    "kernel", [None, "decode_tc_wide", "decode_tc_splitk", "decode_simt_splitk"]
)
def test_replayed_launches_equal_eager_ones(kernel):
    """`mx.compile` replays a plan's kernel nodes: later calls of the same shapes on new data
    (and on a strided query view) give the eager launch's answer bit for bit."""
    for seed in (21, 22):
        q, *rest = make_case(
            seed,
            [1, 700, 2100, 4097],
            num_kv_heads=8,
            gqa=4,
            head_dim=128,
            block_size=16,
            dtype=BF16,
        )
        view = mx.concatenate([q, q], axis=3)[..., 128:]
        for queries in (q, view):
            replayed = paged_attention_decode(queries, *rest, scale=0.088, kernel=kernel)
            eager = paged_attention_decode(
                queries, *rest, scale=0.088, kernel=kernel, compiled=False
            )
            assert mx.array_equal(replayed, eager).item()
            assert max_error(replayed, reference(queries, *rest, 0.088)) <= TOLERANCE[BF16]


def test_query_view_with_strides():
    """Queries sliced from a wider tensor are read through their strides, not copied."""
    inputs = make_case(5, [77, 300], num_kv_heads=2, gqa=4, head_dim=64, block_size=16, dtype=F32)
    wide = mx.concatenate([inputs[0], inputs[0] * 2], axis=3)  # (B, Hq, 1, 2D)
    view = wide[..., 64:]
    out = paged_attention_decode(view, *inputs[1:], scale=0.125)
    assert max_error(out, reference(view, *inputs[1:], 0.125)) <= TOLERANCE[F32]


def test_flat_rows_read_as_4d_pages_do():
    """The pool's flat rows `[blocks * block_size, Hkv, D]` with their block size give every
    kernel the output of the same pages passed 4D, bit for bit; `flat_output` the same output
    as `(B, Hq * D)` rows."""
    q, k_pages, v_pages, tables, lens = make_case(
        11, [1, 53, 1301, 4097], num_kv_heads=8, gqa=4, head_dim=128, block_size=16, dtype=BF16
    )
    flat = [p.reshape(-1, *p.shape[2:]) for p in (k_pages, v_pages)]
    for kernel in (None,) + SIMT + TENSOR_CORES:
        four_d = paged_attention_decode(q, k_pages, v_pages, tables, lens, scale=0.088,
                                        kernel=kernel)  # fmt: skip
        rows = paged_attention_decode(q, *flat, tables, lens, scale=0.088, kernel=kernel,
                                      block_size=16)  # fmt: skip
        assert mx.array_equal(rows, four_d).item(), kernel
        flat_out = paged_attention_decode(q, *flat, tables, lens, scale=0.088, kernel=kernel,
                                          block_size=16, flat_output=True)  # fmt: skip
        assert flat_out.shape == (q.shape[0], q.shape[1] * q.shape[3])
        assert mx.array_equal(flat_out, four_d.reshape(flat_out.shape)).item(), kernel


def test_unservable_inputs_name_the_spec():
    inputs = make_case(1, [20], num_kv_heads=2, gqa=2, head_dim=64, block_size=16, dtype=F32)
    with pytest.raises(UnsupportedSpecError, match="sinks"):
        paged_attention_decode(*inputs, scale=0.1, sinks=mx.zeros((4,)))
    with pytest.raises(UnsupportedSpecError, match="bf16/fp16"):
        paged_attention_decode(*inputs, scale=0.1, kernel="decode_tc")
    odd = make_case(1, [20], num_kv_heads=2, gqa=2, head_dim=48, block_size=16, dtype=F32)
    with pytest.raises(UnsupportedSpecError, match="head_dim=48"):
        paged_attention_decode(*odd, scale=0.1)
