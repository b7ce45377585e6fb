"""The small random models `bench memory` runs: a llama (2 layers x 4 KV heads x 64 dims,
bfloat16), a Qwen3.5-like hybrid (3 Gated DeltaNet layers and 1 full-attention layer of the
same K/V shape, so a token's K/V is half the llama's while each sequence also keeps about 390
tokens' worth of recurrent state), a Gemma-3-like model (5 sliding-window layers of 128
tokens to 1 full-attention layer) and a Gemma-4-like one (the same, its full-attention layer of
another K/V shape), and a DeepSeek-V3-like one with multi-head latent attention (a latent of 128
and a RoPE key part of 64 a token a layer, no heads). Their weights do not change memory
behaviour."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

_ATTENTION = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 4096,
    "vocab_size": 512,
}
CONFIGS = {
    "llama": {"model_type": "llama", "num_hidden_layers": 2, "rms_norm_eps": 1e-5, **_ATTENTION},
    "qwen3_5": {
        "model_type": "qwen3_5",
        "num_hidden_layers": 4,
        "full_attention_interval": 4,
        "linear_num_key_heads": 4,
        "linear_num_value_heads": 8,
        "linear_key_head_dim": 64,
        "linear_value_head_dim": 64,
        "linear_conv_kernel_dim": 4,
        "rms_norm_eps": 1e-6,
        **_ATTENTION,
    },
}
CONFIGS["gemma3"] = {
    "model_type": "gemma3_text",
    "num_hidden_layers": 6,
    "sliding_window": 128,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 64,
    "rope_local_base_freq": 10000.0,
    "rms_norm_eps": 1e-6,
    **_ATTENTION,
}
# Gemma-4-like: the global layer caches K/V of another shape than the window layers (one KV
# head of 128, K = V: half a window layer's bytes a token).
CONFIGS["gemma4"] = {
    "model_type": "gemma4_text",
    "num_hidden_layers": 6,
    "sliding_window": 128,
    "sliding_window_pattern": 6,
    "global_head_dim": 128,
    "num_global_key_value_heads": 1,
    "attention_k_eq_v": True,
    "num_kv_shared_layers": 0,
    "hidden_size_per_layer_input": 0,
    "vocab_size_per_layer_input": 512,
    "use_double_wide_mlp": False,
    "rms_norm_eps": 1e-6,
    **_ATTENTION,
}
# DeepSeek-V3-like: every layer keeps one latent row and one RoPE key row a token (MLA).
CONFIGS["deepseek_v3"] = {
    "model_type": "deepseek_v3",
    "num_hidden_layers": 2,
    "q_lora_rank": None,
    "kv_lora_rank": 128,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 64,
    "v_head_dim": 64,
    "rms_norm_eps": 1e-6,
    "rope_scaling": None,
    **_ATTENTION,
}
KV_GROUP_SIZE = 64


def build_model(out: Path, family: str = "llama") -> Path:
    """A random `CONFIGS[family]` model with a byte-level tokenizer, as an mlx-lm folder."""
    import importlib

    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    config = CONFIGS[family]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        ["memory density benchmark"] * 10,
        trainer=trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|eos|>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|eos|>").save_pretrained(str(out))
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    mx.random.seed(0)
    model = module.Model(module.ModelArgs.from_dict(dict(config)))
    model.set_dtype(mx.bfloat16)
    save_model(out, model)
    save_config({**config, "eos_token_id": 0}, config_path=out / "config.json")
    return out


def attention_layers(family: str) -> list[tuple[int, int, int, int | None]]:
    """Per attention layer: KV heads, K and V head sizes, and sliding window (None: full
    attention). An MLA layer is one "head" of the latent (K) and the RoPE key part (V)."""
    config = CONFIGS[family]
    heads, dim, layers = (
        config["num_key_value_heads"],
        config["head_dim"],
        config["num_hidden_layers"],
    )
    if "kv_lora_rank" in config:
        return [(1, config["kv_lora_rank"], config["qk_rope_head_dim"], None)] * layers
    if "full_attention_interval" in config:  # the hybrid: the others keep recurrent state
        return [(heads, dim, dim, None)] * (layers // config["full_attention_interval"])
    pattern = config.get("sliding_window_pattern")
    full_dim = config.get("global_head_dim", dim)
    full = (config.get("num_global_key_value_heads") or heads, full_dim, full_dim)
    return [
        (*full, None) if pattern is None or (i + 1) % pattern == 0
        else (heads, dim, dim, config["sliding_window"])
        for i in range(layers)
    ]  # fmt: skip


def kv_bytes_per_token(family: str = "llama", kv_bits: int = 16) -> int:
    """KV bytes one token of the model takes, K and V of every attention layer."""
    return kv_bytes_kept(family, 1, kv_bits)


def kv_bytes_kept(family: str, num_tokens: int, kv_bits: int = 16) -> int:
    """KV bytes a sequence of `num_tokens` needs: every token in full-attention layers, the
    last `sliding_window` in sliding-window layers."""
    from mlx_paged.kernels.quantized_pages import layer_bytes_per_token as layer_bytes

    return sum(
        layer_bytes(heads, k_dim, mx.bfloat16, kv_bits, kv_bits, KV_GROUP_SIZE, v_dim)
        * (num_tokens if window is None else min(num_tokens, window))
        for heads, k_dim, v_dim, window in attention_layers(family)
    )


def state_bytes_per_sequence(model_dir: Path) -> int:
    """Bytes of recurrent state one sequence keeps (0 for attention-only models), as the
    paged path's probe finds them."""
    from mlx_lm import load

    from mlx_paged.kv.state_pool import slot_bytes
    from mlx_paged.runner.paged_setup import paged_layout

    model, _ = load(str(model_dir))
    return slot_bytes(paged_layout(model).state)
