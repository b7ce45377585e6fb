"""The end-to-end decode benchmark's arithmetic (`bench/decode.py`): methods timed in turns,
the tokens/s of each sample and the round-by-round ratio, on fake runs whose times are known."""

from __future__ import annotations

import pytest

from mlx_paged.bench.decode import _interleaved


def test_methods_take_turns_and_pair_their_samples_round_by_round():
    calls = []
    # Seconds for 128 tokens and for 1; method b decodes in half a's time.
    times = {"a": {128: 2.0, 1: 0.73}, "b": {128: 1.365, 1: 0.73}}

    def runner(name):
        def run(n):
            drift = 0.5 * (len(calls) // 4)  # each round slower than the last
            calls.append((name, n))
            return times[name][n] + drift

        return run

    methods = _interleaved({"a": runner("a"), "b": runner("b")}, batch=64, new=128, repeats=3)
    # Each round runs every method's pair (full, first) in order, so drift reaches both.
    assert calls == [("a", 128), ("a", 1), ("b", 128), ("b", 1)] * 3
    a, b = methods["a"], methods["b"]
    # Within a pair the drift cancels: a's samples are 64 x 127 / (2.0 - 0.73) each round.
    assert a["samples"] == pytest.approx([64 * 127 / 1.27] * 3)
    assert a["decode_tok_s"] == pytest.approx(64 * 127 / 1.27)
    assert b["decode_tok_s"] == pytest.approx(64 * 127 / 0.635)
    assert (a["paired_ratio"], b["paired_ratio"]) == pytest.approx((1.0, 2.0))


def test_host_time_splits_into_the_engine_s_parts_per_step():
    from types import SimpleNamespace

    from mlx_paged.bench.decode import _step_counters, _step_split

    names = ("", "_wait", "_build", "_dispatch", "_deliver")
    metrics = SimpleNamespace(decode_steps_total=0, mixed_steps_total=3,
                              mixed_step_seconds_total=0.2,
                              **{f"decode{n}_seconds_total": 0.0 for n in names})  # fmt: skip
    llm = SimpleNamespace(engine=SimpleNamespace(metrics=metrics))
    before = _step_counters(llm)
    # 10 steps: 0.05 s of decode, 0.01 waiting, 0.015 building, 0.02 dispatching,
    # 0.004 delivering, so 0.001 s of other host work.
    metrics.decode_seconds_total, metrics.decode_wait_seconds_total = 0.05, 0.01
    metrics.decode_build_seconds_total, metrics.decode_dispatch_seconds_total = 0.015, 0.02
    metrics.decode_deliver_seconds_total, metrics.decode_steps_total = 0.004, 10
    # and 2 steps with prompt work, 0.09 s together (their ramp), counted apart.
    metrics.mixed_steps_total, metrics.mixed_step_seconds_total = 5, 0.29
    figures = _step_split(llm, before)
    assert figures == pytest.approx({
        "host_ms_per_step": 4.0, "wait_ms_per_step": 1.0, "build_ms_per_step": 1.5,
        "dispatch_ms_per_step": 2.0, "deliver_ms_per_step": 0.4, "other_ms_per_step": 0.1,
        "mixed_steps": 2, "mixed_ms_per_step": 45.0,
    })  # fmt: skip
