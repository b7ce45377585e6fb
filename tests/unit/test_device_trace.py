"""The decode-window arithmetic of `bench trace` (`bench/device_trace.py`) on made-up traces."""

from __future__ import annotations

import pytest

from mlx_paged.bench.device_trace import busy_and_gaps, decode_window, summarize, tally


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur}


def _call(name: str, ts: float, dur: float) -> dict:
    return {"cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur}


def test_busy_time_is_the_union_of_overlapping_kernels():
    busy, gaps = busy_and_gaps([(10, 20), (0, 5), (15, 30), (40, 41)])
    assert busy == 5 + 20 + 1
    assert gaps == [5, 10]
    assert busy_and_gaps([]) == (0.0, [])


def test_the_window_starts_after_the_last_prefill_attention_kernel():
    events = [
        _kernel("gemm", 0, 5),
        _kernel("cudnn_sdpa_flash_fprop", 10, 50),
        _call("cudaGraphLaunch", 30, 2),
        _kernel("gemm", 70, 5),
        {"cat": "Trace", "name": "no time"},
    ]
    assert [e["ts"] for e in decode_window(events)] == [70]
    assert len(decode_window(events[:1])) == 1  # no prefill: every event with a time


def test_tally_counts_and_sums_by_name_largest_first():
    events = [_call("a", 0, 1), _call("b", 0, 5), _call("a", 3, 2), _kernel("k", 0, 9)]
    assert tally(events, ("cuda_runtime",)) == {"b": (1, 5.0), "a": (2, 3.0)}


def test_summary_is_per_decode_step():
    # Two steps of 1,000 µs each, 600 µs busy apiece (argmax, a gemm), after a prefill.
    events = [_kernel("sdpa_prefill", 0, 100)]
    for start in (1000, 2000):
        events += [_kernel("gemm", start, 500), _kernel("ArgMax_reduce", start + 500, 100),
                   _call("cudaFree", start + 700, 300)]  # fmt: skip
    s = summarize(events)
    assert s["steps"] == 2
    assert s["busy_ms_per_step"] == pytest.approx(0.6)
    assert s["span_ms_per_step"] == pytest.approx(1.6 / 2)
    assert s["idle_ms_per_step_by_gap"]["100-500 us"] == pytest.approx(0.2)
    assert s["kernels"][0] == {"name": "gemm", "count": 2, "ms_per_step": 0.5, "us_each": 500}
    assert s["cuda_calls"] == [{"name": "cudaFree", "count": 2, "ms_per_step": pytest.approx(0.3)}]


def test_a_trace_without_decode_steps_is_an_error():
    with pytest.raises(ValueError, match="no decode steps"):
        summarize([_kernel("gemm", 0, 5)])
