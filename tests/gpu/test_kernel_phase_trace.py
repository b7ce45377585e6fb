"""The `tr` variant on the GPU: the same attention, and a trace whose rows make sense."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from paged_cases import TOLERANCE, make_case, max_error, reference

from mlx_paged.bench import phase_trace

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("variant", ["mma_s3_tr_fused", "mma_s3_ea_tr_fused"])
def test_traced_call_matches_reference_and_orders_its_phases(variant):
    lens = [1, 300, 2048, 5000]  # partitions of 1024: 1, 1, 2 and 5 live of 5 each
    q, k_pages, v_pages, tables, lens_a = make_case(3, lens, num_kv_heads=2, gqa=4,
                                                    head_dim=128, block_size=16,
                                                    dtype=mx.bfloat16)
    out, trace = phase_trace.traced_call(q, k_pages, v_pages, tables, lens_a, 0.088, variant)
    trace = np.array(trace)
    assert max_error(out, reference(q, k_pages, v_pages, tables, lens_a, 0.088)) \
        <= TOLERANCE[mx.bfloat16]
    assert trace.shape == (5 * 4 * 2, phase_trace.COLUMNS)
    live = trace[trace[:, phase_trace.START] > 0]
    assert len(live) == 2 * (1 + 1 + 2 + 5)
    cols = [phase_trace.START, phase_trace.LANDED, phase_trace.LOOPED, phase_trace.COUNTED,
            phase_trace.END]
    # Without early loads the copies issue after the length is known; with them, before.
    start = ([phase_trace.START, phase_trace.LENGTH, phase_trace.ISSUED, phase_trace.LANDED]
             if "ea" not in variant.split("_") else
             [phase_trace.START, phase_trace.ISSUED, phase_trace.LENGTH, phase_trace.LANDED])
    assert np.all(np.diff(live[:, start], axis=1) >= 0)
    assert np.all(np.diff(live[:, cols], axis=1) >= 0)
    # One partition of each (sequence, KV head) merged.
    assert live[:, phase_trace.MERGED].sum() == 4 * 2
    assert phase_trace.summary(trace).startswith("18 threadgroups (22 empty)")


def test_traced_single_pass():
    lens = [1, 300, 5000]
    q, k_pages, v_pages, tables, lens_a = make_case(4, lens, num_kv_heads=2, gqa=4,
                                                    head_dim=128, block_size=16,
                                                    dtype=mx.bfloat16)
    out, trace = phase_trace.traced_call(q, k_pages, v_pages, tables, lens_a, 0.088,
                                         "mma_s3_tr", partition=0)
    assert max_error(out, reference(q, k_pages, v_pages, tables, lens_a, 0.088)) \
        <= TOLERANCE[mx.bfloat16]
    trace = np.array(trace)
    assert trace.shape == (3 * 2, phase_trace.COLUMNS) and np.all(trace[:, phase_trace.START] > 0)
    cols = [phase_trace.START, phase_trace.LENGTH, phase_trace.ISSUED, phase_trace.LANDED,
            phase_trace.LOOPED, phase_trace.END]
    assert np.all(np.diff(trace[:, cols], axis=1) >= 0)
    # Warp 0's steps: ceil(pages / 4) for each row (one sub-page per step at block 16).
    assert sorted(trace[:, phase_trace.STEPS].tolist()) == [1, 1, 5, 5, 79, 79]
