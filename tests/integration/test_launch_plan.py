"""Launch plans: one per decode shape, cached, with the grids and shapes the routing implies
(Metal: its kernel objects build on the CPU too)."""

import mlx.core as mx
import pytest

from mlx_paged.kernels.kernel_spec import UnsupportedSpecError
from mlx_paged.kernels.paged_attention_plan import launch_plan


def _plan(num_seqs, table_blocks, **kw):
    args = dict(
        backend="metal",
        dtype=mx.bfloat16,
        num_seqs=num_seqs,
        num_heads=32,
        num_queries=1,
        head_dim=128,
        block_size=16,
        num_kv_heads=8,
        table_blocks=table_blocks,
        sliding_window=False,
    )
    args.update(kw)
    return launch_plan(**args)


def test_split_k_plan_has_partitions_of_the_routed_length():
    plan = _plan(2, 128)  # 2048 tokens of table: four 512-token partitions, two-pass on Metal
    assert plan.name == "decode_simt_splitk_metal_bf16_hd128_bs16_g4_p512"
    assert plan.grid == (128 * 8, 2, 4) and plan.threadgroup == (128, 1, 1)
    assert plan.partial_shapes == ((2, 32, 4, 128), (2, 32, 4), (2, 32, 4))
    assert not plan.fused and plan.groups == 16
    assert plan.reduce_kernel is not None and plan.reduce_grid == (32 * 32, 2, 1)


def test_single_pass_plan_when_the_groups_fill_the_gpu():
    plan = _plan(128, 32)  # 1024 (sequence, KV head) groups: single pass
    assert plan.partial_shapes == () and plan.grid == (128 * 8, 128, 1)
    assert plan.reduce_kernel is None


def test_plans_are_cached_per_shape():
    assert _plan(3, 64) is _plan(3, 64)
    assert _plan(3, 64) is not _plan(4, 64)


def test_unservable_shapes_raise():
    with pytest.raises(UnsupportedSpecError, match="not a multiple"):
        _plan(1, 8, num_heads=12)
    with pytest.raises(UnsupportedSpecError, match="one query per row"):
        _plan(1, 8, num_queries=2)


@pytest.fixture
def cuda_plans(monkeypatch):
    """CUDA launch plans on this CPU machine: the real routing, rendering and grids, with a
    stand-in for the one step that needs a CUDA device (building the `cuda_kernel` object)."""
    import mlx_paged.kernels.paged_attention_plan as plan_module

    monkeypatch.setattr(plan_module, "build", lambda spec: spec)
    launch_plan.cache_clear()
    yield lambda num_seqs, table_blocks: _plan(num_seqs, table_blocks, backend="cuda")
    launch_plan.cache_clear()


def test_cuda_routing_single_pass_from_40_groups_wide_up_to_72(cuda_plans):
    prefix = "_cuda_bf16_hd128_bs16_g4"
    # 8 sequences x 8 KV heads at 32k tokens: one pass of 8 simdgroups (256 threads).
    plan = cuda_plans(8, 2048)
    assert plan.kernel.name == "decode_tc_wide" + prefix and plan.partial_shapes == ()
    assert plan.grid == (256 * 8, 8, 1) and plan.threadgroup == (256, 1, 1) and not plan.fused
    assert cuda_plans(5, 512).kernel.name == "decode_tc_wide" + prefix  # 40 groups at 8k
    assert cuda_plans(9, 512).kernel.name == "decode_tc_wide" + prefix  # 72
    # From 80 groups the single pass keeps 4 simdgroups.
    plan = cuda_plans(10, 512)
    assert plan.kernel.name == "decode_tc" + prefix and plan.grid == (128 * 8, 10, 1)
    assert cuda_plans(64, 128).kernel.name == "decode_tc" + prefix  # 512 groups at 2k
    # Tables of up to 2048 tokens: one pass at any count.
    assert cuda_plans(1, 128).kernel.name == "decode_tc_wide" + prefix
    # 4 sequences (32 groups) at 8k: the fused split-K of 1024-token partitions.
    plan = cuda_plans(4, 512)
    assert plan.kernel.name == "decode_tc_splitk" + prefix + "_p1024"
    assert plan.fused and plan.grid == (128 * 8, 4, 8)
    # Its partials in one array: (4, 32, 8) rows of 128 outputs, a maximum and a sum.
    assert plan.partial_shapes == ((4 * 32 * 8 * 130,),) and plan.counter_slots == 32
    # 48 sequences (384 groups) past 16k tokens: the direct split-K, 2048-token partitions.
    plan = cuda_plans(48, 2048)
    assert plan.kernel.name == "decode_tc_splitk_direct" + prefix + "_p2048"
    assert plan.grid[2] == 16


def test_cuda_few_groups_on_long_tables_aim_at_256_threadgroups(cuda_plans):
    prefix = "_cuda_bf16_hd128_bs16_g4"
    # 1, 2 and 4 sequences of 8 KV heads at 32k tokens: 256 threadgroups each.
    for seqs, size in ((1, 1024), (2, 2048), (4, 4096)):
        plan = cuda_plans(seqs, 2048)
        assert plan.kernel.name == "decode_tc_splitk_direct" + prefix + f"_p{size}"
        assert plan.fused and plan.grid == (128 * 8, seqs, 32768 // size)
        assert plan.partial_shapes == ((seqs * 32 * (32768 // size) * 130,),)


class _StandInKernel:
    """Records each call and computes an answer from the inputs with MLX ops, in place of a
    custom kernel (which cannot run on this CPU): output 0 is queries * scale + lens[0]
    broadcast to its shape (a reduce's: the partials summed over partitions + lens[0]); every
    other output is filled with its index."""

    def __init__(self):
        self.calls = []

    def __call__(self, *, inputs, template, grid, threadgroup, output_shapes, output_dtypes):
        self.calls.append(
            dict(
                num_inputs=len(inputs),
                template=template,
                grid=grid,
                threadgroup=threadgroup,
                output_shapes=output_shapes,
                output_dtypes=output_dtypes,
            )
        )
        if len(inputs) == 4:  # a reduce: partials (B, H, P, D), maxima, sums, lengths
            first = inputs[0].sum(axis=2, keepdims=True) + inputs[3][0]
        else:
            first = mx.broadcast_to(inputs[0] * inputs[5][0] + inputs[4][0], output_shapes[0])
        first = first.astype(output_dtypes[0])
        return [first] + [
            mx.full(s, i, dtype=d)
            for i, (s, d) in enumerate(zip(output_shapes[1:], output_dtypes[1:]), start=1)
        ]


def _stand_in_plan(kind):
    from mlx_paged.kernels.paged_attention_plan import LaunchPlan

    kernel, reduce_kernel = _StandInKernel(), _StandInKernel()
    partials = () if kind == "single" else ((2, 8, 3, 16), (2, 8, 3), (2, 8, 3))
    plan = LaunchPlan(
        "spec",
        kernel,
        (256, 2, 3),
        (128, 1, 1),
        partials,
        kind == "fused",
        4,
        (2, 8, 1, 16),
        mx.float32,
        reduce_kernel=reduce_kernel if kind == "two_pass" else None,
        reduce_grid=(256, 2, 1),
    )
    return plan, kernel, reduce_kernel


def _stand_in_inputs(seed):
    mx.random.seed(seed)
    queries = mx.random.normal((2, 8, 1, 16))
    pages = mx.zeros((5, 16, 4, 16))
    return [
        queries,
        pages,
        pages,
        mx.zeros((2, 3), dtype=mx.int32),
        mx.array([seed, 7], dtype=mx.int32),
        mx.array([0.5]),
    ]


@pytest.mark.parametrize("kind", ["single", "fused", "two_pass"])
def test_launch_passes_the_plan_to_its_kernels(kind):
    plan, kernel, reduce_kernel = _stand_in_plan(kind)
    inputs = _stand_in_inputs(1)
    extra = [mx.zeros((8,), dtype=mx.int32)] if kind == "fused" else []
    out, *rest = plan.launch_eager(*inputs, *extra)
    call = kernel.calls[0]
    assert call["template"] == [("T", mx.float32)] and call["grid"] == (256, 2, 3)
    assert call["threadgroup"] == (128, 1, 1) and call["num_inputs"] == 6 + len(extra)
    if kind == "single":
        assert call["output_shapes"] == [(2, 8, 1, 16)] and call["output_dtypes"] == [mx.float32]
    elif kind == "fused":
        (counters_next,) = rest
        assert call["output_shapes"] == [(2, 8, 1, 16), *plan.partial_shapes, (8,)]
        assert call["output_dtypes"] == [mx.float32] * 4 + [mx.int32]
        assert counters_next.shape == (8,) and counters_next.dtype == mx.int32
    else:
        assert call["output_shapes"] == list(plan.partial_shapes)
        reduce = reduce_kernel.calls[0]
        assert reduce["grid"] == (256, 2, 1) and reduce["threadgroup"] == (32, 1, 1)
        assert reduce["num_inputs"] == 4 and reduce["output_shapes"] == [(2, 8, 1, 16)]
    assert out.shape == (2, 8, 1, 16)


@pytest.mark.parametrize("kind", ["single", "fused", "two_pass"])
def test_compiled_launch_traces_once_and_replays_on_new_inputs(kind):
    plan, kernel, reduce_kernel = _stand_in_plan(kind)
    extra = [mx.zeros((8,), dtype=mx.int32)] if kind == "fused" else []
    answers = []
    for seed in (1, 2, 3):
        inputs = _stand_in_inputs(seed)
        replayed, eager = plan.launch(*inputs, *extra)[0], plan.launch_eager(*inputs, *extra)[0]
        assert mx.array_equal(replayed, eager).item()
        answers.append(replayed)
    # One trace, then replays: the kernel was called once by mx.compile and once per eager call.
    assert len(kernel.calls) == 1 + 3
    if kind == "two_pass":
        assert len(reduce_kernel.calls) == 1 + 3
    assert not mx.array_equal(answers[0], answers[1]).item()


def test_forced_kernels_and_partition_lengths(cuda_plans):
    plan = _plan(2, 128, kernel="decode_simt")
    assert plan.name == "decode_simt_metal_bf16_hd128_bs16_g4" and plan.partial_shapes == ()
    with pytest.raises(UnsupportedSpecError, match="not a kernel to launch"):
        _plan(2, 128, kernel="decode_reduce")
    with pytest.raises(UnsupportedSpecError, match="CUDA only"):
        _plan(2, 128, kernel="decode_tc")
    plan = _plan(2, 2048, backend="cuda", kernel="decode_tc_splitk_direct", partition_size=4096)
    assert plan.name == "decode_tc_splitk_direct_cuda_bf16_hd128_bs16_g4_p4096"
    assert plan.grid[2] == 8


@pytest.mark.parametrize("bits", [(16, 16, 0), (4, 4, 32)])
def test_two_pass_reduce_gets_seq_lens_and_window_after_the_page_arrays(bits):
    """Quantized pages come as one array (16-bit ones as K and V), so the reduce pass finds
    the lengths and the window by the plan's count of page inputs. The kernels are recording
    stand-ins: a Metal kernel cannot run on this machine."""
    import dataclasses

    plan = _plan(2, 128, sliding_window=True, bits=bits)
    assert plan.page_inputs == (1 if bits[0] < 16 else 2) and plan.reduce_kernel is not None
    seen = {}

    def first(inputs, output_shapes, **_):
        return [mx.zeros(shape) for shape in output_shapes]

    def reduce(inputs, output_shapes, **_):
        seen["reduce"] = inputs
        return [mx.zeros(output_shapes[0])]

    plan = dataclasses.replace(plan, kernel=first, reduce_kernel=reduce)
    lens, window = mx.array([5, 9], mx.int32), mx.array([4], mx.int32)
    pages = [mx.zeros((4,), mx.uint32)] * plan.page_inputs
    tables, scale = mx.zeros((2, 128), mx.int32), mx.array([1.0])
    plan.launch_eager(mx.zeros((2, 32, 1, 128)), *pages, tables, lens, scale, window)
    assert seen["reduce"][3] is lens and seen["reduce"][4] is window


def test_flat_output_plans_declare_the_output_projections_rows():
    """The kernels write flat rows either way; a `flat_output` plan declares them `(B, Hq * D)`,
    a plan of its own (the plans are cached by every argument)."""
    plain, flat = _plan(2, 128), _plan(2, 128, flat_output=True)
    assert plain.out_shape == (2, 32, 1, 128) and flat.out_shape == (2, 32 * 128)
    assert flat is not plain and flat.name == plain.name
    with pytest.raises(UnsupportedSpecError, match="RoPE kernels hand back"):
        _plan(2, 128, rope=True, flat_output=True)


def test_flat_pages_take_their_block_size():
    """The pool's flat rows `[blocks * block_size, Hkv, D]` have a 4D shape only with the
    block size; without it, or with rows that are not whole blocks, they are refused."""
    from mlx_paged.kernels.page_inputs import flat_rows, page_shape

    rows = mx.zeros((64, 8, 128), mx.bfloat16)
    assert page_shape(rows, 16) == (4, 16, 8, 128)
    assert page_shape(rows.reshape(4, 16, 8, 128), None) == (4, 16, 8, 128)
    for block_size in (None, 24):
        with pytest.raises(UnsupportedSpecError, match="flat rows"):
            page_shape(rows, block_size)
    assert flat_rows(rows.reshape(4, 16, 8, 128)).shape == (64, 8, 128)
    assert flat_rows(rows) is rows
