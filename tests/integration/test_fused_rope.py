"""RoPE inside decode attention, through the engine on the CPU (the fused reference path):
the same greedy tokens as the unfused path, every decode step after a row's first counted as
fused, and models whose RoPE the kernels cannot express refused with the reason."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm import load

from mlx_paged import LLM, SamplingParams
from mlx_paged.engine.config import EngineConfig
from mlx_paged.engine.core import Engine
from mlx_paged.kernels.paged_attention_reference import (
    paged_attention_decode_rope_reference,
    paged_attention_reference,
)
from mlx_paged.kv.rope_fusion import DeferredOffset, DeferredRoPE, defer_rope, rope_inv_freq

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog", "paged", "kv cache"]


@pytest.mark.parametrize("compile_decode", ["off", "on"], ids=["eager", "compiled"])
@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text"])
def test_fused_rope_gives_the_unfused_tokens(tiny_model_dir, model_type, compile_decode):
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    results = {}
    for fused_rope in ("off", "on"):
        llm = LLM(str(tiny_model_dir(model_type)), block_size=4, num_blocks=96,
                  enable_prefix_caching=False, fused_rope=fused_rope,
                  compile_decode=compile_decode)  # fmt: skip
        tokens = [r.token_ids for r in llm.generate(PROMPTS, params)]
        results[fused_rope] = tokens, dict(llm.engine.runner.pool.attention_calls)
    assert results["on"][0] == results["off"][0]
    calls = results["on"][1]
    # Each row's first token comes from its prompt step; the 11 after it from fused steps.
    assert calls["reference_rope", "decode"] >= 11 * len(llm.model.layers)
    assert ("reference_rope", "decode") not in results["off"][1]


def test_rope_modules_are_read_and_checked(tiny_model_dir):
    model, _ = load(str(tiny_model_dir("llama")))
    rope = model.layers[0].self_attn.rope
    inv = rope_inv_freq(rope, 16)
    assert inv is not None and inv.shape == (8,) and inv.dtype == mx.float32
    assert rope_inv_freq(nn.RoPE(16, traditional=True), 16) is None  # interleaved pairs
    assert rope_inv_freq(nn.RoPE(32), 16) is None  # rotates more dims than the head has
    freqs = defer_rope(model, 16)
    assert len(freqs) == len(model.layers)
    deferred = model.layers[0].self_attn.rope
    assert isinstance(deferred, DeferredRoPE)
    x = mx.random.normal((1, 4, 1, 16))
    assert deferred(x, offset=DeferredOffset(mx.array([3]))) is x  # left for the kernel
    assert mx.array_equal(deferred(x, offset=3), rope(x, offset=3)).item()


class _Doubling(nn.Module):
    """Not a rotation: it scales its input, so no kernel can express it."""

    dims = 16
    base = 10000.0

    def __call__(self, x, offset=0):
        return 2 * x


def test_a_model_whose_rope_is_not_a_rotation_is_refused_and_left_as_it_was(tiny_model_dir):
    llm = LLM(str(tiny_model_dir("llama")), block_size=4, num_blocks=32)
    for layer in llm.model.layers:
        layer.self_attn.rope = _Doubling()

    with pytest.raises(ValueError, match="not a rotation the decode_rope kernels express"):
        Engine(llm.model, llm.tokenizer, EngineConfig(num_blocks=32, fused_rope="on"))
    assert all(isinstance(layer.self_attn.rope, _Doubling) for layer in llm.model.layers)


def test_fused_reference_equals_rotating_writing_then_attending():
    """The fused op's oracle against the unfused steps it replaces: rotate with nn.RoPE, write
    the new K/V into the pages, then attend (ragged rows, GQA 2, a window)."""
    mx.random.seed(3)
    block_size, heads, dim, lens = 4, 2, 16, [1, 6, 9]
    tables = mx.array([[1, 0, 0], [2, 3, 0], [4, 5, 6]], dtype=mx.int32)
    k_pages = mx.random.normal((7, block_size, heads, dim))
    v_pages = mx.random.normal((7, block_size, heads, dim))
    queries = mx.random.normal((3, 2 * heads, 1, dim))
    keys, values = mx.random.normal((3, heads, 1, dim)), mx.random.normal((3, heads, 1, dim))
    context_lens = mx.array(lens, dtype=mx.int32)
    rope = nn.RoPE(dim, base=10000.0)
    inv = rope_inv_freq(rope, dim)
    for window in (None, 3):
        out, rotated = paged_attention_decode_rope_reference(
            queries, keys, values, k_pages, v_pages, tables, context_lens,
            scale=0.25, rope_inv_freq=inv, window=window,
        )  # fmt: skip
        positions = context_lens - 1
        expected_k = mx.concatenate(
            [rope(keys[i : i + 1], offset=n - 1) for i, n in enumerate(lens)]
        )
        q = mx.concatenate([rope(queries[i : i + 1], offset=n - 1) for i, n in enumerate(lens)])
        blocks = mx.array([tables[i, (n - 1) // block_size].item() for i, n in enumerate(lens)])
        offsets = positions % block_size
        k_new, v_new = mx.array(k_pages), mx.array(v_pages)
        k_new[blocks, offsets] = expected_k[:, :, 0, :]
        v_new[blocks, offsets] = values[:, :, 0, :]
        expected = paged_attention_reference(
            q, k_new, v_new, tables, context_lens, positions[:, None], scale=0.25, window=window
        )
        assert mx.allclose(rotated, expected_k, atol=1e-5).item()
        assert mx.allclose(out, expected, atol=1e-5).item()
