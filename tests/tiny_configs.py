"""The configs of the tiny random-weight models `tiny_models.build_model` writes: what every
family shares (`BASE_CONFIG`), what each adds (`EXTRA`), named variants and wrapper families."""

from __future__ import annotations

from latent_models import LATENT_FAMILIES, ROPE_LLAMA4
from refused_models import REFUSED_FAMILIES

BASE_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "max_position_embeddings": 512,
}
# Gated DeltaNet layers (Qwen3-Next, Qwen3.5, OLMo hybrid), tiny.
GATED_DELTA = {
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 2,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
}
QWEN3_5_ROPE = {
    "type": "default",
    "rope_theta": 10000.0,
    "partial_rotary_factor": 0.5,
    "mrope_section": [2, 1, 1],
}
EXTRA = {
    "llama": {},
    "qwen2": {},
    "mistral": {},
    "phi3": {},
    # Mixtures of experts (the lean decode step keeps their own MoE call).
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
    },
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3": {},
    "gemma3_text": {
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 16,
        "rope_local_base_freq": 10000.0,
    },
    # Hybrids: some layers keep recurrent or convolution state instead of K/V.
    "lfm2": {
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 64,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False,
        "block_ff_dim": 128,
        "layer_types": ["conv", "full_attention"],
    },
    "qwen3_next": {
        **GATED_DELTA,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "decoder_sparse_step": 1,
        "shared_expert_intermediate_size": 64,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "partial_rotary_factor": 0.5,
        "full_attention_interval": 2,
    },
    "qwen3_5": {
        **GATED_DELTA,
        "full_attention_interval": 2,
        "rope_parameters": QWEN3_5_ROPE,
    },
    "qwen3_5_moe": {
        **GATED_DELTA,
        "full_attention_interval": 2,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "shared_expert_intermediate_size": 64,
        "moe_intermediate_size": 64,
        "rope_parameters": QWEN3_5_ROPE,
    },
    "lfm2_moe": {
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "moe_intermediate_size": 64,
        "num_experts": 2,
        "num_experts_per_tok": 1,
        "norm_topk_prob": True,
        "use_expert_bias": True,
        "num_dense_layers": 1,
        "layer_types": ["conv", "full_attention", "conv"],
        "num_hidden_layers": 3,
    },
    "granitemoehybrid": {
        "attention_bias": False,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 0.25,
        "logits_scaling": 1.0,
        "residual_multiplier": 1.0,
        "layer_types": ["mamba", "attention"],
        "mamba_n_heads": 8,
        "mamba_d_head": 16,
        "mamba_proj_bias": False,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_n_groups": 1,
        "mamba_conv_bias": True,
        "shared_intermediate_size": 128,
    },
    "olmo_hybrid": {
        **GATED_DELTA,
        "linear_allow_neg_eigval": True,
        "attention_bias": False,
        "layer_types": ["linear_attention", "full_attention"],
    },
    "nemotron_h": {
        "attention_bias": False,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "mamba_proj_bias": False,
        "ssm_state_size": 16,
        "conv_kernel": 4,
        "n_groups": 1,
        "mlp_bias": False,
        "layer_norm_epsilon": 1e-5,
        "use_bias": False,
        "use_conv_bias": True,
        "hybrid_override_pattern": ["M", "*"],
    },
    "falcon_h1": {
        "mamba_d_ssm": 64,
        "mamba_n_heads": 4,
        "mamba_d_head": 16,
        "mamba_d_state": 16,
        "mamba_chunk_size": 16,
    },
    # Attention with its logits soft-capped, computed by hand (no scaled_dot_product_attention).
    "gemma2": {"query_pre_attn_scalar": 16},
    # Gemma 4 like the 26B: global layers at another head size, fewer KV heads, K = V.
    "gemma4_text": {
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 384,
        "sliding_window": 8,
        "sliding_window_pattern": 2,
        "use_double_wide_mlp": False,
        "num_hidden_layers": 4,
    },
    "ministral3": {"rope_parameters": ROPE_LLAMA4},
    # K heads of 32 against V heads of 16, sinks, window layers of other heads than the full.
    "mimo_v2_flash": {
        "num_experts_per_tok": 2,
        "hybrid_layer_pattern": [0, 1, 1, 0],
        "moe_layer_freq": [0, 1, 0, 1],
        "add_swa_attention_sink_bias": True,
        "add_full_attention_sink_bias": False,
        "sliding_window_size": 8,
        "num_hidden_layers": 4,
        "moe_intermediate_size": 32,
        "n_shared_experts": None,
        "n_routed_experts": 4,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "layernorm_epsilon": 1e-5,
        "swa_rope_theta": 10000.0,
        "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 1,
        "head_dim": 32,
        "v_head_dim": 16,
        "swa_head_dim": 32,
        "swa_v_head_dim": 16,
        "partial_rotary_factor": 0.5,
    },
    # Chunked attention (ChunkedKVCache) on 3 of 4 layers.
    "llama4_text": {
        "attention_bias": False,
        "attention_chunk_size": 8,
        "floor_scale": 4,  # NoPE layers' query scale changes every 4 positions
        "interleave_moe_layer_step": 2,
        "intermediate_size_mlp": 128,
        "num_experts_per_tok": 1,
        "num_local_experts": 2,
        "rope_scaling": None,
        "use_qk_norm": True,
        "num_hidden_layers": 4,
    },
    # Window layers beside full ones, as layer types (served, with KV cache groups).
    "gear": {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8},
    # A window layer and a full one, each with a short convolution over its keys and values
    # (a CacheList of the convolution state and K/V).
    "baichuan_m1": {
        "sliding_window": 8,
        "sliding_window_layers": [0],
        "conv_window": 2,
        "num_swa_attention_heads": 4,
        "num_swa_key_value_heads": 2,
        "tie_word_embeddings": False,
    },
}
EXTRA.update(REFUSED_FAMILIES)
EXTRA.update(LATENT_FAMILIES)
# Named config variants, as "model_type@variant".
VARIANTS = {
    # Gemma 4 like the E2B: the last two layers attend to K/V earlier layers cached.
    "e2b": {
        "num_kv_shared_layers": 2,
        "hidden_size_per_layer_input": 16,
        "attention_k_eq_v": False,
        "num_global_key_value_heads": None,
    },
    # Gemma 4 with two window layers to a global one, whose K/V (1 head of 16) is half a window
    # layer's (2 heads of 16): two window groups, and the global layers' blocks hold two pages
    # (page scale 2), twice the tokens.
    "windows": {"num_hidden_layers": 6, "sliding_window_pattern": 3, "global_head_dim": 16},
}
# Wrappers whose text model is another family, given as "wrapper:inner" (e.g. mistral3 around
# ministral3); the inner config goes under text_config.
WRAPPERS = ("mistral3", "llama4", "gemma4", "gemma3n", "kimi_k25")
