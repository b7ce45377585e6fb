"""`step_log`: one JSON line a step that ran tokens, whose counts add up to the engine's."""

from __future__ import annotations

import json

from test_paged_engine import TEXTS, params, reference

from mlx_paged import LLM
from mlx_paged.engine.step_log import COUNTERS


def test_every_step_that_ran_tokens_is_a_line_and_the_lines_add_up(tiny_model_dir, tmp_path):
    path = tmp_path / "steps.jsonl"
    llm = LLM(str(tiny_model_dir("llama")), kv_paged=True, block_size=4, num_blocks=160,
              max_num_seqs=3, max_num_batched_tokens=12, prefill_step_size=4,
              step_log=str(path))  # fmt: skip
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, p, r in zip(prompts, params(llm), llm.generate(prompts, params(llm))):
        assert r.token_ids == reference(llm, prompt, p.max_tokens)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    m = llm.engine.metrics
    assert set(lines[0]) == {"time", "seconds", "failed", *(name for name, *_ in COUNTERS)}
    assert sum(x["prompt_tokens"] for x in lines) == m.prompt_tokens_total
    assert sum(x["generated_tokens"] for x in lines) == m.generation_tokens_total
    assert sum(x["mixed"] for x in lines) == m.mixed_steps_total > 0  # chunks rode along
    assert all(x["prompt_tokens"] or x["generated_tokens"] for x in lines)
    assert not any(x["failed"] for x in lines)
    for x in lines:  # the decode forward's split is part of the step's wall time
        parts = x["build_seconds"] + x["dispatch_seconds"] + x["device_wait_seconds"]
        assert 0 < x["seconds"] and parts <= x["seconds"] + 1e-6
    assert [x["time"] for x in lines] == sorted(x["time"] for x in lines)
