"""Quantized K/V pages in the engine: mlx-lm's tokens with its quantized cache, prefix hits
and preemption over quantized pages, and a pool that holds more tokens in the same bytes."""

from __future__ import annotations

import pytest
from mlx_lm import stream_generate
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams
from mlx_paged.engine.metrics import render_prometheus

# Prompts of 2+ tokens: mlx-lm quantizes its cache after the first forward, so a 1-token
# prompt's first token attends at full precision there, and over quantized pages here.
TEXTS = ["hello vexed kiwi hello", "zebra quilt yodel mango and more words here", "paged cache"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # head_dim 64: groups of 32 and 64 divide it (the tiny default's head dim does not).
    return build_model(tmp_path_factory.mktemp("llama64"), "llama", head_dim=64,
                       num_attention_heads=4, num_key_value_heads=2)  # fmt: skip


def _mlx_lm(llm, prompt, bits, group, max_tokens):
    return [
        r.token
        for r in stream_generate(llm.model, llm.tokenizer, prompt, max_tokens=max_tokens,
                                 kv_bits=bits, kv_group_size=group, quantized_kv_start=0)
    ]  # fmt: skip


@pytest.mark.parametrize("bits,group", [(8, 64), (4, 32)])
def test_quantized_pages_give_mlx_lm_quantized_cache_tokens(model_dir, bits, group):
    """Both prefill the prompt but its last token at full precision, then attend over K/V
    quantized on write; the pool also holds more tokens in the same bytes."""
    budget = 4 << 20
    llm = LLM(str(model_dir), block_size=4, kv_budget_bytes=budget, kv_bits=bits,
              kv_group_size=group)  # fmt: skip
    plain = LLM(str(model_dir), block_size=4, kv_budget_bytes=budget)
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = [llm.tokenizer.encode(t) for t in TEXTS]
    for prompt, result in zip(prompts, llm.generate(prompts, params)):
        assert result.token_ids == _mlx_lm(llm, prompt, bits, group, 12)
    pool, plain_pool = llm.engine.runner.pool, plain.engine.runner.pool
    assert (pool.k_bits, pool.v_bits, pool.quantized) == (bits, bits, True)
    # float32 pages: 64 x 4 bytes a head; quantized: 64 x bits / 8 + a scale and a bias.
    ratio = (64 * 4) / (64 * bits / 8 + 2 * (64 // group) * 4)
    assert pool.num_blocks == pytest.approx(plain_pool.num_blocks * ratio, rel=0.01)
    assert pool.num_blocks > plain_pool.num_blocks * 3
    # /metrics: 2 layers x 2 KV heads x (K + V) of one token.
    per_token = 2 * 2 * 2 * (64 * bits // 8 + 2 * (64 // group) * 4)
    assert f"mlx_paged_kv_bytes_per_token {per_token}" in render_prometheus(llm.engine)


@pytest.mark.parametrize("compile_decode", ["off", "on"], ids=["eager", "compiled"])
def test_prefix_hits_and_preemption_over_quantized_pages(model_dir, compile_decode):
    """K8/V4 pages: a warm run hits the prefix cache, a tight pool preempts and recomputes
    (eager or replaying compiled decode steps), and both give the tokens of a roomy cold run."""
    settings = dict(block_size=4, kv_bits_k=8, kv_bits_v=4, kv_group_size=32)
    roomy = LLM(str(model_dir), num_blocks=128, **settings)
    prompts = [roomy.tokenizer.encode(t) for t in TEXTS * 2]
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    cold = [r.token_ids for r in roomy.generate(prompts, params)]
    warm = roomy.generate(prompts, params)
    assert [r.token_ids for r in warm] == cold
    assert all(r.num_cached_tokens > 0 for p, r in zip(prompts, warm) if len(p) > 4)
    assert any(len(p) > 4 for p in prompts)
    tight = LLM(str(model_dir), num_blocks=14, compile_decode=compile_decode, **settings)
    assert [r.token_ids for r in tight.generate(prompts, params)] == cold
    assert tight.engine.metrics.preemptions_total > 0
    pool = tight.engine.runner.pool
    assert (pool.k_bits, pool.v_bits) == (8, 4)


def test_fused_rope_refuses_quantized_pages(model_dir):
    """The decode_rope kernels return a 16-bit key for the page write: no quantized pages."""
    with pytest.raises(ValueError, match="fused RoPE writes 16-bit pages"):
        LLM(str(model_dir), num_blocks=16, kv_bits=4, kv_group_size=32, fused_rope="on")
