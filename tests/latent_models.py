"""Tiny configs of the families with multi-head latent attention (MLA), merged into
`tiny_configs.EXTRA`: a latent of 32 and a RoPE key part of 8 a token."""

LATENT = {
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
}
ROPE_LLAMA4 = {
    "rope_type": "default",
    "rope_theta": 10000.0,
    "llama_4_scaling_beta": 0.1,
    "original_max_position_embeddings": 512,
}

LATENT_FAMILIES = {
    "deepseek_v3": {
        **LATENT,
        "n_routed_experts": 2,
        "num_experts_per_tok": 1,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
    },
    "glm4_moe_lite": {**LATENT},
    # DeepSeek Sparse Attention: each query keeps the 8 keys its indexer scores highest.
    "deepseek_v32": {**LATENT, "index_head_dim": 16, "index_n_heads": 8, "index_topk": 8},
    "glm_moe_dsa": {
        **LATENT,
        "index_head_dim": 16,
        "index_n_heads": 8,
        "index_topk": 8,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "n_routed_experts": 2,
        "routed_scaling_factor": 1.0,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 1,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
        "attention_bias": False,
    },
    "mistral4": {
        **LATENT,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "n_routed_experts": 2,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
        "topk_group": 1,
        "num_experts_per_tok": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "rope_parameters": ROPE_LLAMA4,
    },
    # Two MLA sublayers a layer (a CacheList of two), queries and latent rows rescaled.
    "longcat_flash": {
        **LATENT,
        "attention_method": "MLA",
        "zero_expert_type": "identity",
        "ffn_hidden_size": 128,
        "moe_topk": 1,
        "expert_ffn_hidden_size": 32,
        "n_routed_experts": 2,
        "zero_expert_num": 1,
        "num_layers": 2,
        "routed_scaling_factor": 1.0,
        "mla_scale_q_lora": True,
        "mla_scale_kv_lora": True,
        "attention_bias": False,
    },
    # Kimi Delta Attention (recurrent state) on layer 0, MLA without RoPE on layer 1.
    "kimi_linear": {
        **LATENT,
        "linear_attn_config": {
            "kda_layers": [1],
            "num_heads": 2,
            "head_dim": 16,
            "short_conv_kernel_size": 4,
        },
        "model_max_length": 512,
        "num_experts": 2,
        "moe_intermediate_size": 32,
        "first_k_dense_replace": 1,
        "mla_use_nope": True,
    },
    # MLA beside linear attention (bailing_hybrid), and gated MLA (bailing_moe_v3).
    "bailing_hybrid": {
        "moe_intermediate_size": 2,
        "num_experts": 2,
        "num_experts_per_tok": 2,
        "num_shared_experts": 2,
        "n_group": 2,
        "topk_group": 2,
        "first_k_dense_replace": 2,
        "layer_group_size": 2,
        "group_norm_size": 2,
        "routed_scaling_factor": 1.0,
        "kv_lora_rank": 2,
        "qk_rope_head_dim": 2,
        "qk_nope_head_dim": 2,
        "v_head_dim": 2,
    },
    "bailing_moe_v3": {**LATENT},
    # MLA that mlx-lm runs expanded (per-head K/V cached); latent pages on the paged path.
    "deepseek_v2": {
        **LATENT,
        "rope_scaling": {"factor": 1.0, "type": "yarn", "original_max_position_embeddings": 512},
    },
    "minicpm3": {
        **LATENT,
        "dim_model_base": 64,
        "scale_depth": 1.4,
        "scale_emb": 12,
        "rope_scaling": {"original_max_position_embeddings": 512},
    },
    "youtu_llm": {**LATENT},
}
