"""Where decode steps' time goes, as the engine counts it: waiting for the device, building the
step's graph, MLX's dispatch and delivering tokens, parts of the decode time (`/metrics` and
`bench decode`'s host split)."""

from __future__ import annotations

import pytest

from mlx_paged import LLM, SamplingParams
from mlx_paged.engine.metrics import render_prometheus

PARTS = ("wait", "build", "dispatch", "deliver")


@pytest.mark.parametrize("kv_paged", [True, False])
def test_decode_parts_are_counted_and_add_up_to_no_more_than_the_decode_time(
    tiny_model_dir, kv_paged
):
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=kv_paged, max_num_seqs=4)
    llm.generate([[5, 6, 7, 8]] * 3, SamplingParams(max_tokens=12, ignore_eos=True))
    m = llm.engine.metrics
    parts = {part: getattr(m, f"decode_{part}_seconds_total") for part in PARTS}
    assert all(parts[p] > 0 for p in ("build", "dispatch", "deliver")), parts
    assert parts["wait"] >= 0
    assert sum(parts.values()) <= m.decode_seconds_total
    text = render_prometheus(llm.engine)
    for part in PARTS:
        assert f"mlx_paged_decode_{part}_seconds_total {round(parts[part], 6)}" in text
    llm.engine.shutdown()
