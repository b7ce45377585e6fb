"""Multi-head latent attention (MLA) on latent pages: each token keeps one latent row and one RoPE
key row a layer, for every family mlx-lm runs MLA in, those it runs expanded (deepseek_v2,
minicpm3, youtu_llm) and DeepSeek Sparse Attention (deepseek_v32, glm_moe_dsa: each query keeps
the 8 keys its indexer picks, from index keys on pages) included. Greedy tokens equal mlx-lm's
own single-sequence generation cold, from the prefix cache, and in a pool small enough to
preempt."""

from __future__ import annotations

import pytest
from latent_models import LATENT
from mlx_lm import load
from tiny_models import mlx_lm_greedy

from mlx_paged import LLM, SamplingParams

FAMILIES = [
    "deepseek_v3",
    "deepseek_v32",
    "glm_moe_dsa",
    "kimi_k25:deepseek_v3",
    "glm4_moe_lite",
    "mistral4",
    "mistral3:mistral4",
    "longcat_flash",
    "kimi_linear",
    "bailing_hybrid",
    "bailing_moe_v3",
    "deepseek_v2",
    "minicpm3",
    "youtu_llm",
]
PROMPTS = [list(range(5, 24)), [11, 12, 13], list(range(30, 70))]
MAX_TOKENS = 10


def mlx_lm_tokens(path: str, prompts=PROMPTS, max_tokens=MAX_TOKENS) -> list[list[int]]:
    """Each prompt alone through mlx-lm's `generate_step`, greedy."""
    return mlx_lm_greedy(load(path)[0], prompts, max_tokens)


@pytest.mark.parametrize("model_type", FAMILIES)
def test_latent_tokens_equal_mlx_lm_cold_cached_and_preempted(tiny_model_dir, model_type):
    path = str(tiny_model_dir(model_type))
    expected = mlx_lm_tokens(path)
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)

    llm = LLM(path, num_blocks=64, block_size=4)
    assert [r.token_ids for r in llm.generate(PROMPTS, params)] == expected
    again = llm.generate(PROMPTS, params)
    assert [r.token_ids for r in again] == expected
    assert [r.num_cached_tokens for r in again] == [16, 0, 36]
    calls = llm.engine.runner.pool.attention_calls
    sparse = model_type in ("deepseek_v32", "glm_moe_dsa")  # DeepSeek Sparse Attention
    assert calls["latent_sparse" if sparse else "latent_reference", "decode"]
    assert calls["latent_rows", "prefill"]
    paths = {"latent_sparse" if sparse else "latent_reference", "latent_rows", "latent_causal"}
    assert {path for path, _ in calls} <= paths

    small = LLM(path, num_blocks=18, block_size=4)
    assert [r.token_ids for r in small.generate(PROMPTS, params)] == expected
    assert small.engine.metrics.preemptions_total > 0


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v2"])
def test_pages_hold_one_latent_row_and_one_rope_key_row_a_token(tiny_model_dir, model_type):
    llm = LLM(str(tiny_model_dir(model_type)), num_blocks=16, block_size=4)
    pool = llm.engine.runner.pool
    rank, rope = LATENT["kv_lora_rank"], LATENT["qk_rope_head_dim"]
    layers = range(pool.num_layers)
    assert {pool.layer_side(i, 0).shape for i in layers} == {(16, 4, 1, rank)}
    assert {pool.layer_side(i, 1).shape for i in layers} == {(16, 4, 1, rope)}
    assert {p.k.shape for p in pool.pages} == {(16 * 4, 1, rank)}  # stored as flat rows
    # deepseek_v2's own cache keeps 4 heads of 16 + 8 (K) and 16 (V): 160 values a token.
    token_bytes = pool.nbytes // (16 * 4)
    assert token_bytes == len(pool.pages) * (rank + rope) * pool.dtype.size


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v32"])
def test_chunked_prefill_rides_with_decode_rows_exactly(tiny_model_dir, model_type):
    """A long prompt prefilled in chunks beside running decode rows (the mixed forward)."""
    path = str(tiny_model_dir(model_type))
    prompts = [list(range(5, 12)), list(range(20, 90))]
    expected = mlx_lm_tokens(path, prompts, 16)
    llm = LLM(path, num_blocks=64, block_size=4, max_num_seqs=4, max_num_batched_tokens=9,
              prefill_step_size=16)  # fmt: skip
    got = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert [r.token_ids for r in got] == expected


def test_index_keys_sit_beside_the_latent_rows_half_on_each_side(tiny_model_dir):
    """DeepSeek Sparse Attention: a layer's indexer keys (16 values) are an attention slot of
    their own, 8 values a side, so a token costs 32 + 8 + 16 values a layer."""
    llm = LLM(str(tiny_model_dir("deepseek_v32")), num_blocks=16, block_size=4)
    pool = llm.engine.runner.pool
    shapes = [(p.k.shape[-1], p.v.shape[-1]) for p in pool.pages]
    assert shapes == [(32, 8), (8, 8)] * 2
    assert pool.nbytes // (16 * 4) == 2 * (32 + 8 + 16) * pool.dtype.size


def test_latent_pages_refuse_what_they_do_not_take(tiny_model_dir):
    path = str(tiny_model_dir("deepseek_v3"))
    with pytest.raises(ValueError, match="fused RoPE needs one K/V shape"):
        LLM(path, num_blocks=16, fused_rope="on")


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_latent_pages_pack_both_sides_and_stay_close(tiny_model_dir, tmp_path, bits):
    """`--kv-bits` quantizes the latent and the RoPE keys each in their own groups of 32: a row
    of 64 latent and 32 RoPE values holds 96 bytes of them at 8 bits (48 at 4) and 3 fp32
    scales and biases (24 bytes). At 8 bits the tokens are the unquantized pages' (a tiny
    random model drifts at 4); what the rows hold: `test_quantized_pages`."""
    from tiny_models import build_model

    path = str(build_model(tmp_path / "dsv3", "deepseek_v3", kv_lora_rank=64,
                           qk_rope_head_dim=32))  # fmt: skip
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    exact = LLM(path, num_blocks=64, block_size=4).generate(PROMPTS, params)
    llm = LLM(path, num_blocks=64, block_size=4, kv_bits=bits, kv_group_size=32)
    pool = llm.engine.runner.pool
    row_words = {8: 30, 4: 18}[bits]
    assert {p.rows.shape for p in pool.pages} == {(64, 4, 1, row_words)}
    got = llm.generate(PROMPTS, params)
    if bits == 8:
        assert [r.token_ids for r in got] == [r.token_ids for r in exact]
    again = llm.generate(PROMPTS, params)
    assert [r.token_ids for r in again] == [r.token_ids for r in got]


@pytest.mark.parametrize("model_type", ["deepseek_v3", "deepseek_v32"])
@pytest.mark.parametrize("options", [{"draft_model": "ngram"}, {"compile_decode": "on"}])
def test_speculative_and_compiled_steps_stay_exact(tiny_model_dir, options, model_type):
    """Prompt lookup's verify rows are decode rows of the latent path; so are compiled steps."""
    path = str(tiny_model_dir(model_type))
    prompts = [list(range(5, 24)) * 2, [11, 12, 13] * 4]
    expected = mlx_lm_tokens(path, prompts, 16)
    llm = LLM(path, num_blocks=64, block_size=4, **options)
    got = llm.generate(prompts, SamplingParams(max_tokens=16, ignore_eos=True))
    assert [r.token_ids for r in got] == expected
    runner = llm.engine.runner
    assert runner.spec_drafts > 0 if "draft_model" in options else runner.compiled_decode
