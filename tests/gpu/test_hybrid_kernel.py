"""Hybrid models on the GPU: a Qwen3.5-like and a Nemotron-H-like model decode through the
kernel in compiled steps (state slots gathered and scattered inside the trace), the Qwen3.5
layers on the generated gated-delta kernels (the recurrence for prompts, the whole layer step
for decode), and give mlx-lm's own single-sequence greedy tokens, as the reference path does."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [list(range(5, 40)), [11, 12, 13], list(range(40, 140))]
MAX_TOKENS = 24


@pytest.mark.parametrize("model_type", ["qwen3_5", "nemotron_h"])
def test_hybrid_kernel_steps_give_mlx_lm_tokens(tmp_path, model_type):
    # head_dim 64 with 4 query / 2 KV heads: a spec the kernels serve; float32 keeps ties away.
    # The Gated DeltaNet layers at sizes the recurrence kernel serves, 2 value heads a key head.
    linear = (
        dict(linear_key_head_dim=64, linear_value_head_dim=32, linear_num_value_heads=4)
        if model_type == "qwen3_5"
        else {}
    )
    folder = build_model(
        tmp_path / model_type, model_type, head_dim=64, num_attention_heads=4,
        num_key_value_heads=2, **linear,
    )  # fmt: skip
    model, _ = load(str(folder))
    expected = [
        [int(t) for (t, _), _ in zip(generate_step(mx.array(p), model), range(MAX_TOKENS))]
        for p in PROMPTS
    ]
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    for mode, compiled in (("kernel", "on"), ("kernel", "off"), ("reference", "off")):
        llm = LLM(str(folder), block_size=16, num_blocks=64, paged_attention=mode,
                  compile_decode=compiled)  # fmt: skip
        for _ in range(2):  # cold, then from the prefix cache
            assert [r.token_ids for r in llm.generate(PROMPTS, params)] == expected, mode
        calls = llm.engine.runner.pool.attention_calls
        assert (calls.get(("kernel", "decode"), 0) > 0) == (mode == "kernel")
        if model_type == "qwen3_5":  # prompts ran the recurrence kernel, decode steps the
            # whole-step kernel
            for path, phase in (
                ("gated_delta_kernel", "prefill"),
                ("gated_delta_step_kernel", "decode"),
            ):
                ran = calls.get((path, phase), 0) > 0
                assert ran == (mode == "kernel"), (mode, path)
            assert calls.get(("gated_delta_kernel", "decode"), 0) == 0
