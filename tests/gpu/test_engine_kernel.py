"""The engine on the GPU: greedy tokens with the decode kernel equal those of the reference
path, and the path counters prove the kernel produced them."""

from __future__ import annotations

import mlx.core as mx
import pytest
from tiny_models import build_model

from mlx_paged import LLM, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog and more",
    "paged",
    "continuous batching joins and leaves every step of the way",
]


@pytest.mark.parametrize("model_type", ["llama", "gemma3_text"])
def test_kernel_tokens_equal_reference_tokens(tmp_path, model_type):
    # head_dim 64 with 4 query / 2 KV heads: a spec the kernels serve (GQA 2; gemma3 adds
    # sliding-window layers). float32 weights keep greedy ties away. The lean step, not the
    # fused one (which rotates in its own kernel), so that `fused_rope` reaches attention.
    folder = build_model(
        tmp_path / model_type, model_type, head_dim=64, num_attention_heads=4, num_key_value_heads=2
    )
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    results = {}
    for mode, fused_rope, compiled in (
        ("kernel", "off", False),
        ("kernel", "auto", False),
        ("kernel", "auto", True),
        ("reference", "off", False),
    ):
        llm = LLM(str(folder), block_size=16, num_blocks=64, paged_attention=mode,
                  enable_prefix_caching=False, compile_decode="on" if compiled else "off",
                  fused_rope=fused_rope, lean_decode="on")  # fmt: skip
        tokens = [r.token_ids for r in llm.generate(PROMPTS, params)]
        results[mode, fused_rope, compiled] = (tokens, dict(llm.engine.runner.pool.attention_calls))
    reference_tokens, reference_calls = results["reference", "off", False]
    assert all(len(t) == 40 for t in reference_tokens)
    assert reference_calls.get(("kernel", "decode"), 0) == 0
    unfused_tokens, unfused_calls = results["kernel", "off", False]
    assert unfused_tokens == reference_tokens
    assert unfused_calls.get(("kernel", "decode"), 0) >= 2 * 39
    assert unfused_calls.get(("kernel_rope", "decode"), 0) == 0
    for compiled in (False, True):
        fused_tokens, fused_calls = results["kernel", "auto", compiled]
        assert fused_tokens == unfused_tokens
        # Every decode step but each row's first (its prompt's last token) runs decode_rope.
        assert fused_calls.get(("kernel_rope", "decode"), 0) >= 2 * 38
        assert fused_calls.get(("reference", "decode"), 0) == 0


def test_compiled_steps_replay_the_tensor_core_kernels_with_the_eager_tokens(tmp_path):
    """bf16 pages at head_dim 64: one long row takes the fused split-K kernel (its counters
    pass through the traced step), then a wide batch the single-pass kernel."""
    folder = build_model(
        tmp_path / "llama", "llama", head_dim=64, num_attention_heads=8, num_key_value_heads=2,
        max_position_embeddings=4096, dtype=mx.bfloat16,
    )  # fmt: skip
    long_prompt = [[(7 * i) % 300 + 3 for i in range(2200)]]
    wide = [[(11 * i + b) % 300 + 3 for i in range(40)] for b in range(24)]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    results = {}
    for compiled, fused_rope in ((False, "off"), (True, "off"), (False, "auto"), (True, "auto")):
        llm = LLM(str(folder), block_size=16, num_blocks=512, paged_attention="kernel",
                  enable_prefix_caching=False, compile_decode="on" if compiled else "off",
                  fused_rope=fused_rope)  # fmt: skip
        results[compiled, fused_rope] = [
            [r.token_ids for r in llm.generate(prompts, params)] for prompts in (long_prompt, wide)
        ]
        assert llm.engine.runner.pool.dtype == mx.bfloat16
    for fused_rope in ("off", "auto"):  # a replayed step computes what the eager one does
        assert results[True, fused_rope] == results[False, fused_rope]
    # RoPE in the kernel rounds the rotated query and key to bf16 as mx.fast.rope does, but
    # its angles may differ from MLX's by an ulp, and a random bf16 model's near-ties then
    # flip a few greedy tokens late in a row: each row agrees on its first 8 tokens, and 90%
    # of all tokens agree.
    fused, unfused = (sum(results[False, f], []) for f in ("auto", "off"))
    prefixes = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x))
                for x, y in zip(fused, unfused)]  # fmt: skip
    same = sum(a == b for x, y in zip(fused, unfused) for a, b in zip(x, y))
    total = sum(len(x) for x in unfused)
    print(f"fused vs unfused RoPE: {same}/{total} tokens agree; first divergence {prefixes}")
    assert min(prefixes) >= 8 and same >= 0.9 * total


def test_gemma4_global_layers_of_head_size_512_decode_on_the_kernel(tmp_path):
    """Gemma 4's shapes: sliding layers at head size 64, global ones at 512 with K = V and one
    KV head; every layer of every decode step runs the kernel, with the reference's tokens."""
    folder = build_model(
        tmp_path / "gemma4", "gemma4_text", head_dim=64, global_head_dim=512,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    results = {}
    for mode in ("kernel", "reference"):
        llm = LLM(str(folder), block_size=16, num_blocks=64, paged_attention=mode,
                  enable_prefix_caching=False)  # fmt: skip
        tokens = [r.token_ids for r in llm.generate(PROMPTS, params)]
        results[mode] = tokens, dict(llm.engine.runner.pool.attention_calls)
    (kernel_tokens, kernel_calls), (reference_tokens, _) = results["kernel"], results["reference"]
    assert kernel_tokens == reference_tokens and all(len(t) == 40 for t in kernel_tokens)
    assert kernel_calls.get(("reference", "decode"), 0) == 0
    assert kernel_calls.get(("kernel", "decode"), 0) >= 4 * 39  # 4 layers, 39 steps at least


def _mlx_lm_and_engine_tokens(folder, prompts, steps=24):
    """mlx-lm's single-sequence greedy tokens for `prompts`, the engine's under "auto", and
    the engine's attention calls."""
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    model, _ = load(str(folder))
    expected = [
        [int(t) for (t, _), _ in zip(generate_step(mx.array(p), model), range(steps))]
        for p in prompts
    ]
    llm = LLM(str(folder), block_size=16, num_blocks=64)
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    tokens = [r.token_ids for r in llm.generate(prompts, params)]
    return expected, tokens, llm.engine.runner.pool.attention_calls


def test_v_heads_of_another_size_decode_on_the_kernel_with_mlx_lm_tokens(tmp_path):
    """mimo_v2_flash without sinks at K 192 / V 128 (expanded MLA's sizes): every decode
    step's attention runs the SIMT kernels, and the greedy tokens are mlx-lm's."""
    folder = build_model(
        tmp_path / "mimo", "mimo_v2_flash", head_dim=192, v_head_dim=128, swa_head_dim=192,
        swa_v_head_dim=128, add_swa_attention_sink_bias=False,
    )  # fmt: skip
    expected, tokens, calls = _mlx_lm_and_engine_tokens(folder, [list(range(5, 45)), [7, 8, 9]])
    assert tokens == expected
    assert calls.get(("reference", "decode"), 0) == 0 and calls.get(("kernel", "decode"), 0) > 0


def test_sinks_decode_on_the_reference_path_with_mlx_lm_tokens(tmp_path):
    """mimo_v2_flash's window layers add attention sinks, which no kernel computes: "auto"
    decodes on the reference path, and the greedy tokens are mlx-lm's single-sequence ones."""
    folder = build_model(tmp_path / "mimo", "mimo_v2_flash")
    expected, tokens, calls = _mlx_lm_and_engine_tokens(folder, [list(range(5, 45)), [7, 8, 9]])
    assert tokens == expected
    assert calls.get(("kernel", "decode"), 0) == 0 and calls.get(("reference", "decode"), 0) > 0


@pytest.mark.parametrize("model_type", ["gemma2", "llama4:llama4_text"])
def test_soft_capped_and_chunked_attention_decode_on_the_kernel(tmp_path, model_type):
    """gemma2's soft-capped scores and llama4's chunks (of 8 tokens: the 40-token prompt
    crosses five) on the SIMT kernels: every decode step's attention, mlx-lm's tokens."""
    folder = build_model(
        tmp_path / "m", model_type, head_dim=64, num_attention_heads=4, num_key_value_heads=2
    )
    expected, tokens, calls = _mlx_lm_and_engine_tokens(folder, [list(range(5, 45)), [7, 8, 9]])
    assert tokens == expected
    assert calls.get(("reference", "decode"), 0) == 0 and calls.get(("kernel", "decode"), 0) > 0
