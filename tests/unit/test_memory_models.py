"""What `bench memory` counts as a sequence's used KV bytes, per model family: every token in
full-attention layers, the last window's in sliding-window layers, each layer at its shape."""

from __future__ import annotations

from mlx_paged.bench.memory_models import attention_layers, kv_bytes_kept, kv_bytes_per_token

ROW = 2 * 2  # K and V, bfloat16, per head value


def test_attention_layers_of_each_family():
    assert attention_layers("llama") == [(4, 64, 64, None)] * 2
    assert attention_layers("qwen3_5") == [(4, 64, 64, None)]  # 3 of 4 layers keep state
    assert attention_layers("gemma3") == [(4, 64, 64, 128)] * 5 + [(4, 64, 64, None)]
    assert attention_layers("gemma4") == [(4, 64, 64, 128)] * 5 + [(1, 128, 128, None)]
    # MLA: a latent of 128 (K) and a RoPE key part of 64 (V) a layer.
    assert attention_layers("deepseek_v3") == [(1, 128, 64, None)] * 2


def test_bytes_kept_grow_with_the_full_layers_only_past_the_window():
    assert kv_bytes_per_token("gemma4") == (5 * 4 * 64 + 128) * ROW
    assert kv_bytes_kept("gemma4", 100) == 100 * kv_bytes_per_token("gemma4")
    assert kv_bytes_kept("gemma4", 1000) == (5 * 4 * 64 * 128 + 128 * 1000) * ROW
    assert kv_bytes_kept("gemma3", 1000) == (5 * 128 + 1000) * 4 * 64 * ROW
    assert kv_bytes_kept("llama", 10, kv_bits=8) < kv_bytes_kept("llama", 10)
    assert kv_bytes_per_token("deepseek_v3") == 2 * (128 + 64) * 2
    # 8 bits in groups of 64: 192 bytes of values, 3 bf16 scales and biases, 8-byte rows.
    assert kv_bytes_per_token("deepseek_v3", kv_bits=8) == 2 * 208
