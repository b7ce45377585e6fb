"""The generated paged decode kernels against the pure-MLX reference, on the GPU."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from paged_cases import TOLERANCE, make_case, max_error, reference

from mlx_paged.codegen.spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention import paged_attention_decode

pytestmark = pytest.mark.gpu

BF16, F16, F32 = mx.bfloat16, mx.float16, mx.float32
# (dtype, head_dim, block_size, gqa, sliding window): every supported value appears at least once.
SPECS = (
    [(BF16, 128, 16, g, None) for g in range(1, 9)]
    + [(F16, 128, 16, 4, None), (F32, 128, 16, 4, None)]
    + [(BF16, d, 16, 4, None) for d in (64, 80, 96, 256)] + [(BF16, 256, 16, 8, None)]
    + [(BF16, 128, 8, 4, None), (BF16, 128, 32, 4, None)]
    + [(F32, 80, 8, 3, None), (F16, 96, 32, 5, None), (F32, 256, 16, 8, None),
       (F16, 64, 32, 1, None), (F32, 64, 16, 7, None), (BF16, 96, 8, 6, None)]
    + [(BF16, 128, 16, 4, 100), (F32, 64, 8, 2, 37), (F16, 80, 32, 8, 700)]
)


def _id(case):
    dtype, d, bs, g, window = case
    return f"{str(dtype).split('.')[-1]}-hd{d}-bs{bs}-g{g}" + (f"-sw{window}" if window else "")


def _assert_both_passes_match(inputs, ref, variant=None, dtype=BF16, scale=0.088):
    """The single pass and split-K of `variant` on `inputs` both match `ref`."""
    for single_pass in (True, False):
        out = paged_attention_decode(*inputs, scale=scale, single_pass=single_pass,
                                     variant=variant)
        assert max_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("case", SPECS, ids=_id)
@pytest.mark.parametrize("single_pass", [True, False], ids=["1pass", "2pass"])
def test_kernel_matches_reference(case, single_pass):
    dtype, head_dim, block_size, gqa, window = case
    # Ragged: one token, a partly filled block, an exact multiple of the block, several
    # partitions, a partition boundary.
    lens = [1, block_size * 3 + 5, block_size * 8, 1301, 512, 1537]
    inputs = make_case(7, lens, num_kv_heads=2, gqa=gqa, head_dim=head_dim,
                       block_size=block_size, dtype=dtype)
    scale = head_dim ** -0.5
    out = paged_attention_decode(*inputs, scale=scale, window=window, single_pass=single_pass)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    err = max_error(out, reference(*inputs, scale, window))
    assert err <= TOLERANCE[dtype], f"max abs error {err}"


@pytest.mark.parametrize("batch", [1, 3, 64, 256])
def test_batch_sizes(batch):
    rng = np.random.default_rng(batch)
    lens = [int(n) for n in rng.integers(1, 700, size=batch)]
    inputs = make_case(batch, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16,
                       dtype=BF16)
    for single_pass in (True, False, None):
        out = paged_attention_decode(*inputs, scale=0.088, single_pass=single_pass)
        assert max_error(out, reference(*inputs, 0.088)) <= TOLERANCE[BF16]


@pytest.mark.parametrize("dtype", [BF16, F32], ids=["bf16", "f32"])
def test_long_context_32k(dtype):
    lens = [32768, 20001, 4097]
    inputs = make_case(3, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16, dtype=dtype)
    _assert_both_passes_match(inputs, reference(*inputs, 0.088), dtype=dtype)


@pytest.mark.parametrize("variant", ["mma_s3_pf4", "mma_s3_pf16", "mma_s3_pf8_fused",
                                     "mma_s3_lr", "mma_s3_lr_fused", "mma_s3_rt8",
                                     "mma_s3_rt8_fused", "mma_s3_ea_fused"])
def test_long_ring_variants_match_reference(variant):
    """pfN: a simdgroup's prefetches run past the 32 block ids its lanes hold (single pass: 512
    pages a simdgroup at 32k), and stop at its last page. lr, rtN: over thousands of steps the
    max grows at scattered steps, each of which must still rescale (rtN: once past N)."""
    lens = [32768, 4097, 1043, 17]
    inputs = make_case(5, lens, num_kv_heads=2, gqa=4, head_dim=128, block_size=16, dtype=BF16)
    _assert_both_passes_match(inputs, reference(*inputs, 0.088), variant)


@pytest.mark.parametrize("variant", ["w1", "w2", "w8", "s1_w16", "s1", "s2", "s4", "s2_w8",
                                     "t32", "t8", "c1", "c2", "t32_c4_w8", "s1_t32_w2",
                                     "s4_c4", "s2_t32_c2", "mma", "mma_w2", "mma_w8", "c4",
                                     "o4", "c2_o5", "fused", "fused_w8", "s2_fused", "mma_u2",
                                     "mma_u2_fused", "mma_u3_w8", "mma_u4", "mma_s2",
                                     "mma_s3_fused", "mma_s2_w8", "mma_s4_w2", "mma_u2_s4_fused",
                                     "mma_u2_s4_w2", "mma_s3_kq_fused", "mma_s2_kq_w8",
                                     "mma_s6_w1_fused", "mma_s8_w1", "mma_s5_w2_fused",
                                     "mma_s4_w2_fused", "mma_s3_pf2_fused", "mma_s3_pf4_fused",
                                     "mma_s3_pf8_fused", "mma_s3_pf16", "mma_s3_pf4_kq_fused",
                                     "mma_s3_lr", "mma_s3_lr_fused", "mma_s2_lr_w8",
                                     "mma_s3_rt8", "mma_s3_rt8_fused", "mma_s3_rt2_fused",
                                     "mma_s3_ea", "mma_s3_ea_fused", "mma_s3_ea_kq_fused",
                                     "mma_s2_ea_w8"])
def test_tuning_variants(variant):
    """The variants `mlx-paged bench kernels --variant` times compute the same attention."""
    lens = [1, 77, 512, 1301]
    inputs = make_case(11, lens, num_kv_heads=2, gqa=2, head_dim=128, block_size=16, dtype=BF16)
    _assert_both_passes_match(inputs, reference(*inputs, 0.088), variant)


# Ring variants checked on every family the tensor-core ring serves.
_RING_CASES = [c for c in SPECS if c[0] != F32 and c[2] % 16 == 0 and c[1] % 64 == 0]
_RING_VARIANTS = ("mma_s6_w1", "mma_s3_pf4", "mma_s3_lr", "mma_s3_rt8", "mma_s3_ea")
# The shared-memory ring (the default loads straight into registers) on a spread of families,
# and the tensor-core path on every family it serves (bf16/fp16, blocks of 16 or 32).
FAMILIES = ([("s2", c) for c in SPECS[::2]] + [("s4", c) for c in SPECS[1::4]]
            + [("mma", c) for c in SPECS if c[0] != F32 and c[2] % 16 == 0]
            + [("fused", c) for c in SPECS] + [("mma_fused", SPECS[3])]
            + [("mma_u2", c) for c in SPECS if c[0] != F32 and c[2] % 16 == 0]
            + [("mma_u2_fused", SPECS[3])]
            + [("mma_s3", c) for c in SPECS if c[0] != F32 and c[2] % 16 == 0 and c[1] % 64 == 0]
            + [("mma_s3_fused", SPECS[3])]
            + [("mma_s3_w8", c) for c in _RING_CASES if c[1] <= 128]
            + [("mma_u2_s4", c) for c in SPECS
               if c[0] != F32 and c[2] % 16 == 0 and c[1] in (64, 128)]
            + [("mma_u2_s4_fused", SPECS[3])]
            + [("mma_s3_kq", c) for c in SPECS
               if c[0] != F32 and c[2] % 16 == 0 and c[1] in (64, 128)]
            + [("mma_s3_kq_fused", SPECS[3])]
            + [(v, c) for v in _RING_VARIANTS for c in _RING_CASES]
            + [(v + "_fused", SPECS[3]) for v in _RING_VARIANTS])


@pytest.mark.parametrize("variant,case", FAMILIES,
                         ids=[f"{v}-{_id(c)}" for v, c in FAMILIES])
@pytest.mark.parametrize("single_pass", [True, False], ids=["1pass", "2pass"])
def test_variant_families_match_reference(variant, case, single_pass):
    dtype, head_dim, block_size, gqa, window = case
    lens = [1, block_size * 3 + 5, block_size * 8 + 1, 1301, 512, 1537]
    inputs = make_case(9, lens, num_kv_heads=4, gqa=gqa, head_dim=head_dim,
                       block_size=block_size, dtype=dtype)
    scale = head_dim ** -0.5
    out = paged_attention_decode(*inputs, scale=scale, window=window, single_pass=single_pass,
                                 variant=variant)
    err = max_error(out, reference(*inputs, scale, window))
    assert err <= TOLERANCE[dtype], f"max abs error {err}"


@pytest.mark.parametrize("partition_size", [128, 512, 2048])
def test_fused_reduce_calls_in_one_graph(partition_size):
    """Fused split-K calls built into one graph with no data dependency between them: each
    counts on the counters the call before zeroed (`CounterChain`), including across a chain
    that grows past 256 (sequence, KV head) groups; every answer stays exact (sliding windows
    that skip partitions included)."""
    calls = []
    wide = [int(n) for n in np.random.default_rng(6).integers(1, 2500, size=40)]
    for seed, lens, window in ((3, [1, 700, 2100], None), (4, [4097, 33, 900, 1500], None),
                               (5, [3000, 129], 300), (6, wide, None), (7, wide[:9], 200),
                               (3, [1, 700, 2100], None)):
        inputs = make_case(seed, lens, num_kv_heads=8, gqa=4, head_dim=128, block_size=16,
                           dtype=BF16)
        out = paged_attention_decode(*inputs, scale=0.088, window=window, single_pass=False,
                                     partition_size=partition_size, variant="fused")
        calls.append((out, reference(*inputs, 0.088, window)))
    mx.eval([out for out, _ in calls])  # one graph: the launches run back to back
    for out, ref in calls:
        assert max_error(out, ref) <= TOLERANCE[BF16]


@pytest.mark.parametrize("variant,single_pass", [(None, None), ("mma_s3_w8", True),
                                                 ("mma_s3_fused", False), ("", False)],
                         ids=["routed", "single", "fused", "two_pass"])
def test_replayed_launches_equal_eager_ones(variant, single_pass):
    """`mx.compile` replays a plan's kernel nodes: later calls of the same shapes on new data
    (and on a strided query view) give the eager launch's answer bit for bit."""
    for seed in (21, 22):
        q, *rest = make_case(seed, [1, 700, 2100, 4097], num_kv_heads=8, gqa=4, head_dim=128,
                             block_size=16, dtype=BF16)
        view = mx.concatenate([q, q], axis=3)[..., 128:]
        for queries in (q, view):
            args = dict(scale=0.088, variant=variant, single_pass=single_pass)
            replayed = paged_attention_decode(queries, *rest, **args)
            eager = paged_attention_decode(queries, *rest, compiled=False, **args)
            assert mx.array_equal(replayed, eager).item()
            assert max_error(replayed, reference(queries, *rest, 0.088)) <= TOLERANCE[BF16]


@pytest.mark.parametrize("variant", ["fused_pg", "mma_fused_pg", "mma_u2_fused_pg"])
@pytest.mark.parametrize("batch", [1, 7, 64])
def test_grid_partitions_match_reference(variant, batch):
    """`pg`: the launcher picks the partition count, the kernel derives their length from the
    grid; answers stay exact whatever the count (uneven last partitions, empty ones)."""
    rng = np.random.default_rng(batch)
    lens = ([4097, 1] + [int(n) for n in rng.integers(1, 3000, size=batch)])[:batch]
    for partition_size, window in ((128, None), (256, None), (128, 700)):
        inputs = make_case(batch, lens, num_kv_heads=4, gqa=4, head_dim=128, block_size=16,
                           dtype=BF16)
        out = paged_attention_decode(*inputs, scale=0.088, window=window, single_pass=False,
                                     partition_size=partition_size, variant=variant)
        assert max_error(out, reference(*inputs, 0.088, window)) <= TOLERANCE[BF16]


@pytest.mark.parametrize("variant", ["mma_s3_dw2_fused", "mma_s3_dw1_fused", "mma_s3_dw4_fused",
                                     "mma_s3_w8_dw2_fused", "mma_s3_lr_dw2_fused",
                                     "mma_s6_w1_dw4_fused"])
def test_dynamic_pages_match_reference(variant):
    """dwN: the partitions of a sequence share its pages through a counter. Answers stay exact
    for ragged lengths, partitions left idle by short rows, rows long enough that most grabs
    are dynamic, sliding windows, blocks of 32 and head_dim 64, with all the calls in one
    graph (each call zeroes the next one's page and merge counters)."""
    calls = []
    long_rows = [int(n) for n in np.random.default_rng(8).integers(1, 9000, size=12)]
    for seed, lens, window, partition, kv, gqa, hd, bs, dtype in (
            (3, [1, 700, 2100, 4097, 9000], None, 1024, 8, 4, 128, 16, BF16),
            (4, [20000], None, 1024, 8, 4, 128, 16, BF16),
            (5, [3000, 129, 5000], 300, 256, 2, 4, 128, 16, BF16),
            (6, long_rows, None, 512, 4, 8, 128, 32, F16),
            (7, [33, 5000, 17], 700, 512, 2, 2, 64, 32, F16),
            (3, [1, 700, 2100, 4097, 9000], None, 1024, 8, 4, 128, 16, BF16)):
        inputs = make_case(seed, lens, num_kv_heads=kv, gqa=gqa, head_dim=hd, block_size=bs,
                           dtype=dtype)
        out = paged_attention_decode(*inputs, scale=0.088, window=window, single_pass=False,
                                     partition_size=partition, variant=variant)
        calls.append((out, reference(*inputs, 0.088, window), dtype))
    mx.eval([out for out, _, _ in calls])
    for out, ref, dtype in calls:
        assert max_error(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("variant", ["mma_s3_ea", "mma_s3_ea_fused", "mma_s3_ea_kq_fused"])
def test_early_loads_ignore_table_entries_past_the_sequence(variant):
    """ea reads block ids and copies first pages before it knows the length: whatever the
    table holds past a sequence's pages (-1, ids past the pool) must not reach the output."""
    lens = [1, 17, 1024, 1043, 3000]
    q, k_pages, v_pages, tables, lens_a = make_case(13, lens, num_kv_heads=2, gqa=4,
                                                    head_dim=128, block_size=16, dtype=BF16)
    ref = reference(q, k_pages, v_pages, tables, lens_a, 0.088)
    junk = np.array(tables)
    for row, n in enumerate(lens):
        used = -(-n // 16)
        junk[row, used:] = np.where(np.arange(junk.shape[1] - used) % 2, -1, 1 << 30)
    _assert_both_passes_match((q, k_pages, v_pages, mx.array(junk), lens_a), ref, variant)


def test_query_view_with_strides():
    """Queries sliced from a wider tensor are read through their strides, not copied."""
    inputs = make_case(5, [77, 300], num_kv_heads=2, gqa=4, head_dim=64, block_size=16,
                       dtype=F32)
    wide = mx.concatenate([inputs[0], inputs[0] * 2], axis=3)  # (B, Hq, 1, 2D)
    view = wide[..., 64:]
    out = paged_attention_decode(view, *inputs[1:], scale=0.125)
    assert max_error(out, reference(view, *inputs[1:], 0.125)) <= TOLERANCE[F32]


@pytest.mark.parametrize("variant", [None, "mma_s3_fused", "mma_u2_fused", "fused"])
def test_head_major_page_views(variant):
    """Pages stored `[Hkv, block, D]` and passed as their `[block, Hkv, D]` view are read
    through their strides (the benchmark's `--head-major-pages` layout experiment)."""
    q, k_pages, v_pages, tables, lens = make_case(11, [1, 53, 1301, 4097], num_kv_heads=8,
                                                  gqa=4, head_dim=128, block_size=16,
                                                  dtype=BF16)
    k_view = mx.contiguous(k_pages.swapaxes(1, 2)).swapaxes(1, 2)
    v_view = mx.contiguous(v_pages.swapaxes(1, 2)).swapaxes(1, 2)
    _assert_both_passes_match((q, k_view, v_view, tables, lens),
                              reference(q, k_pages, v_pages, tables, lens, 0.088), variant)


def test_unservable_inputs_name_the_spec():
    inputs = make_case(1, [20], num_kv_heads=2, gqa=2, head_dim=64, block_size=16, dtype=F32)
    with pytest.raises(UnsupportedSpecError, match="sinks"):
        paged_attention_decode(*inputs, scale=0.1, sinks=mx.zeros((4,)))
    odd = make_case(1, [20], num_kv_heads=2, gqa=2, head_dim=48, block_size=16, dtype=F32)
    with pytest.raises(UnsupportedSpecError, match="head_dim=48"):
        paged_attention_decode(*odd, scale=0.1)
