"""The end-to-end decode benchmark's arithmetic (`bench/decode.py`): the warm-up and the
tokens/s of each sample, on a fake run whose times are known."""

from __future__ import annotations

import pytest

from mlx_paged.bench.decode import _decode_tok_s


def test_decode_tok_s_warms_up_at_the_full_length_then_times_full_minus_first():
    calls = []
    times = {128: 2.0, 1: 0.73}  # seconds for 128 tokens and for 1

    def run(n):
        calls.append(n)
        return times[n] + 0.01 * (len(calls) // 2)  # each later pair a little slower

    median, samples = _decode_tok_s(run, batch=64, new=128, repeats=3)
    # One warm-up of the full length, then (full, first) per sample.
    assert calls == [128, 128, 1, 128, 1, 128, 1]
    # Both runs of a pair share the drift, so each sample is 64 x 127 / (2.0 - 0.73).
    assert [round(s, 6) for s in samples] == [round(64 * 127 / 1.27, 6)] * 3
    assert median == pytest.approx(64 * 127 / 1.27)
