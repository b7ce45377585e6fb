"""The lean decode step (`models/lean_decode.py`) of llama, mistral, ministral3 (also inside
mistral3), qwen2, qwen3, phi3, gemma3, the MoE forms (qwen2_moe, qwen3_moe, mixtral) and the MLA
families on latent pages (deepseek_v2, deepseek_v3, kimi_k25, glm4_moe_lite): greedy tokens
equal mlx-lm's own generation, eager and compiled, on plain and quantized weights; the
projections it stacks are what the model's own (prefill) calls read; other families and
`lean_decode="off"` keep mlx-lm's forward."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from tiny_models import mlx_lm_greedy

from mlx_paged import LLM, SamplingParams

PROMPTS = [list(range(5, 24)), [11, 12, 13], list(range(30, 70))]
MAX_TOKENS = 16


def mlx_lm_tokens(model) -> list[list[int]]:
    return mlx_lm_greedy(model, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("compile_decode", ["off", "on"])
@pytest.mark.parametrize(
    "model_type",
    ["llama", "mistral", "ministral3", "mistral3:ministral3", "qwen2", "qwen3", "phi3",
     "gemma3_text", "qwen3_moe", "qwen2_moe", "mixtral", "deepseek_v3", "kimi_k25:deepseek_v3",
     "glm4_moe_lite", "deepseek_v2"],
)  # fmt: skip
def test_lean_steps_give_mlx_lms_tokens(tiny_model_dir, model_type, compile_decode):
    path = str(tiny_model_dir(model_type))
    expected = mlx_lm_tokens(load(path)[0])
    llm = LLM(path, num_blocks=64, block_size=4, compile_decode=compile_decode, lean_decode="on")
    assert llm.engine.runner.lean is not None
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [r.token_ids for r in got] == expected


def test_quantized_weights_stack_and_stay_exact(tiny_model_dir, tmp_path):
    from quantized_models import build_quantized_model

    path = build_quantized_model(tmp_path / "q", "llama", intermediate_size=128,
                                 hidden_size=128, head_dim=32)  # fmt: skip
    expected = mlx_lm_tokens(load(str(path))[0])
    llm = LLM(str(path), num_blocks=64, block_size=4, lean_decode="on")
    layer = llm.engine.runner.lean.layers[0]
    assert layer.qkv.rows == [128, 64, 64]
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [r.token_ids for r in got] == expected


def test_the_models_own_projections_read_the_stacked_weights(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), num_blocks=32, block_size=4, lean_decode="on")
    runner = llm.engine.runner
    layer = runner.lean.layers[0]
    attn = layer.block.self_attn
    x = mx.random.normal((3, attn.q_proj.weight.shape[1]))
    q, k, v = layer.qkv(x)
    for got, proj in zip((q, k, v), (attn.q_proj, attn.k_proj, attn.v_proj)):
        assert mx.array_equal(got, proj(x)).item()


def test_other_families_and_lean_off_keep_mlx_lms_forward(tiny_model_dir):
    assert LLM(str(tiny_model_dir("gemma2")), num_blocks=32).engine.runner.lean is None
    path = str(tiny_model_dir("llama"))
    off = LLM(path, num_blocks=64, block_size=4, lean_decode="off")
    assert off.engine.runner.lean is None
    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)
    assert [r.token_ids for r in off.generate(PROMPTS, params)] == mlx_lm_tokens(load(path)[0])


def test_sliding_window_layers_keep_their_windows(tmp_path):
    """A llama with window layers (KV cache groups): the lean step hands each layer its
    window."""
    from tiny_models import build_model

    path = str(build_model(tmp_path / "w", "llama", sliding_window=8,
                           layer_types=["sliding_attention", "full_attention"]))  # fmt: skip
    llm = LLM(path, num_blocks=64, block_size=4)
    assert llm.engine.runner.lean.windows == [8, None]
    got = llm.generate(PROMPTS, SamplingParams(max_tokens=24, ignore_eos=True))
    expected = mlx_lm_greedy(load(path)[0], PROMPTS, 24)
    assert [r.token_ids for r in got] == expected
