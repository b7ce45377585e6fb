"""The `tr` variant's trace summary (`bench/phase_trace.py`) on a hand-made trace, and the
refusal of `tr` by the product launcher."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.bench import phase_trace
from mlx_paged.codegen.build import define
from mlx_paged.codegen.spec import KernelSpec, UnsupportedSpecError
from mlx_paged.kernels.paged_attention_plan import launch_plan


def _row(sm, start, landed, looped, counted, end, merged=0, steps=16):
    # The length lands 0.5 µs after the start, the block ids (copies issued) 0.5 µs later.
    return [sm, start, landed, looped, counted, end, steps, merged, start + 500, start + 1000]


def test_summary_of_a_small_trace():
    base = 1_000_000  # the GPU clock's origin is arbitrary
    trace = np.array([
        _row(0, base + 0, base + 2000, base + 10000, base + 11000, base + 11000),
        _row(0, base + 1000, base + 3000, base + 19000, base + 20000, base + 20000),
        _row(1, base + 0, base + 4000, base + 12000, base + 13000, base + 20000, merged=1),
        [0] * phase_trace.COLUMNS,  # an empty partition
    ], dtype=np.int64)
    text = phase_trace.summary(trace, bins=2).splitlines()
    assert text[0] == ("3 threadgroups (1 empty) on 2 SMs, 20.0 µs from the first start to the "
                       "last end; warp 0 ran 16 steps (median)")
    # Medians: first K/V 2, 2, 4 µs; loops 8, 16, 8; tails 1, 1, 1; one merge of 7.
    assert text[1] == ("median µs: start to first K/V 2.00, loop 8.00, partials + count 1.00, "
                       "merge (last partition) 7.00")
    # The copies land 1, 1 and 3 µs after their issue.
    assert text[2] == ("  of the start: to the length 0.50, to the first copies issued 0.50, "
                       "to their landing 1.00")
    # SM 0 streams 2-19 µs (17 of 20), SM 1 4-12 (8 of 20).
    assert text[3] == "SM time with a threadgroup in its loop: median 62%, min 40%"
    # Bin 0-10 µs: starting 2+2+4 = 8 µs of threadgroups / 10; looping 8+7+6 = 21 µs / 10.
    assert text[5].split() == ["0.0", "µs", "0.8", "2.1", "0.0"]
    # Bin 10-20 µs: looping 0+9+2 = 11 / 10; tails 1+1+8 = 10 / 10.
    assert text[6].split() == ["10.0", "µs", "0.0", "1.1", "1.0"]


def test_summary_refuses_an_empty_trace():
    with pytest.raises(ValueError, match="no threadgroup ran"):
        phase_trace.summary(np.zeros((3, phase_trace.COLUMNS), dtype=np.int64))


def test_tr_is_a_diagnostic_the_launcher_refuses():
    spec = KernelSpec.parse("paged_decode_cuda_bf16_hd128_bs16_g4_p1024_mma_s3_tr_fused")
    defn = define(spec)
    # The trace sits before counters_next, which the counter chain takes as the last output.
    assert defn.output_names[-2:] == ("phase_trace", "counters_next")
    assert "if (st == 0) tr_landed = mlx_paged_globaltimer();" in defn.source
    with pytest.raises(UnsupportedSpecError, match="diagnostic"):
        launch_plan("cuda", mx.bfloat16, 2, 32, 1, 128, 16, 8, 128, False, 1024, None,
                    "mma_s3_tr_fused")
    for bad in ("mma_s3_tr", "mma_tr_fused", "s2_tr_fused", "mma_s3_tr_kq_fused"):
        with pytest.raises(UnsupportedSpecError, match="tr"):
            define(KernelSpec.parse(f"paged_decode_cuda_bf16_hd128_bs16_g4_p1024_{bad}"))
