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


def test_steps_that_carry_prompt_chunks_count_apart_from_decode_steps(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), max_num_seqs=4, max_num_prefill_seqs=1,
              prefill_step_size=16, enable_prefix_caching=False)  # fmt: skip
    # The second prompt enters in chunks while the first one decodes.
    llm.generate([[5, 6, 7, 8], list(range(5, 69))], SamplingParams(max_tokens=12, ignore_eos=True))
    m = llm.engine.metrics
    assert m.mixed_steps_total > 0 and m.mixed_step_seconds_total > 0
    assert m.decode_steps_total > 0
    text = render_prometheus(llm.engine)
    assert f"mlx_paged_mixed_steps_total {m.mixed_steps_total}" in text
    assert f"mlx_paged_decode_steps_total {m.decode_steps_total}" in text
    llm.engine.shutdown()
