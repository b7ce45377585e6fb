"""Which attention path runs, and how the engine says so (CPU: always the reference)."""

from __future__ import annotations

import pytest

from mlx_paged import LLM, SamplingParams
from mlx_paged.engine.metrics import render_prometheus
from mlx_paged.kv.kv_layout import probe_kv_layout


def test_probe_sees_query_heads_and_windows(tiny_model_dir):
    llama = LLM(str(tiny_model_dir("llama")), num_blocks=32)
    layout = probe_kv_layout(llama.model)
    assert (layout.num_layers, layout.num_heads, layout.num_kv_heads, layout.head_dim) == (
        2,
        4,
        2,
        16,
    )
    assert layout.query_dtype == layout.dtype and layout.sliding_window is False
    gemma = LLM(str(tiny_model_dir("gemma3_text")), num_blocks=32)
    assert probe_kv_layout(gemma.model).sliding_window is True


def test_cpu_decode_runs_the_reference_and_counts_it(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_blocks=64, block_size=4)
    pool = llm.engine.runner.pool
    assert pool.decode_backend is None
    llm.generate(
        ["paged attention kv cache block table", "the quick brown fox jumps over"],
        SamplingParams(max_tokens=6, ignore_eos=True),
    )
    calls = pool.attention_calls
    # 2 layers per forward: prefill forwards, then one forward per further token. Fresh
    # prompts attend over their own K/V; one that hits the prefix cache reads its pages, row
    # by row.
    assert calls["causal", "prefill"] > 0 and calls["reference", "prefill"] == 0
    assert calls["reference", "decode"] >= 2 * 5
    llm.generate("paged attention kv cache block table and more", SamplingParams(max_tokens=1))
    assert calls["causal_rows", "prefill"] > 0 and calls["reference", "prefill"] == 0
    assert calls["reference", "decode"] % 2 == 0
    assert calls["kernel", "decode"] == 0
    text = render_prometheus(llm.engine)
    assert (
        f'mlx_paged_attention_calls_total{{path="reference",phase="decode"}} '
        f"{calls['reference', 'decode']}"
    ) in text
    assert 'mlx_paged_attention_calls_total{path="kernel",phase="decode"} 0' in text
    assert (
        f'mlx_paged_attention_calls_total{{path="causal",phase="prefill"}} '
        f"{calls['causal', 'prefill']}"
    ) in text


def test_forcing_the_kernel_without_a_gpu_fails_at_load(tiny_model_dir):
    with pytest.raises(ValueError, match="--paged-attention kernel: .*Metal or CUDA GPU"):
        LLM(str(tiny_model_dir("llama")), num_blocks=32, paged_attention="kernel")
    with pytest.raises(ValueError, match="paged_attention must be one of"):
        LLM(str(tiny_model_dir("llama")), num_blocks=32, paged_attention="fast")
