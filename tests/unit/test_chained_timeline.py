"""The GPU-timeline summary of `bench/chained_timeline.py`, on a hand-written chrome trace."""

import json

import pytest

from mlx_paged.bench.chained_timeline import forced_options, gpu_ops, summarize


def test_gpu_ops_keep_only_gpu_work_in_start_order_and_summarize_gaps(tmp_path):
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "ts": 200.0, "dur": 50.0, "name": "attn"},
        {"ph": "X", "cat": "cpu_op", "ts": 10.0, "dur": 5.0, "name": "launch"},
        {"ph": "X", "cat": "kernel", "ts": 100.0, "dur": 10.0, "name": "fill"},
        {"ph": "X", "cat": "gpu_memset", "ts": 254.0, "dur": 2.0, "name": "fill"},
        {"ph": "X", "cat": "kernel", "ts": 260.0, "dur": 70.0, "name": "attn"},
        {"ph": "i", "cat": "kernel", "ts": 300.0, "name": "marker"},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    ops = gpu_ops(path)
    assert ops == [(100.0, 10.0, "fill"), (200.0, 50.0, "attn"), (254.0, 2.0, "fill"),
                   (260.0, 70.0, "attn")]
    # gaps: fill 0 (first), attn 200 - 110 = 90, fill 254 - 250 = 4, attn 260 - 256 = 4
    assert summarize(ops) == {"fill": (2, 6.0, 2.0), "attn": (2, 60.0, 47.0)}


def test_forced_options_name_a_variant_and_its_pass():
    assert forced_options("mma_s3_w8") == {"variant": "mma_s3_w8"}
    assert forced_options("mma_s3_w8@1pass") == {"variant": "mma_s3_w8", "single_pass": True}
    assert forced_options("mma_s3_w8_fused@4096") == {
        "variant": "mma_s3_w8_fused", "single_pass": False, "partition_size": 4096}
    with pytest.raises(ValueError, match="VARIANT@PARTITION"):
        forced_options("mma_s3@two")
