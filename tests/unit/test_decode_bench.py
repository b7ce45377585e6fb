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
