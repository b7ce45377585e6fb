"""A llama of a given size with random weights and a word-level tokenizer, written offline, for
benchmarks that need real model code but no real checkpoint."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

ONE_B = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}


def build_random_llama(out: Path, config: dict = ONE_B, dtype=mx.bfloat16, seed: int = 0) -> Path:
    """Write an mlx-lm llama folder with random `dtype` weights into `out`; returns `out`."""
    from mlx.utils import tree_map
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w1").save_pretrained(str(out))
    full = {"model_type": "llama", **config, "eos_token_id": 1}
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(full))
    # Small weights keep activations finite through 16 random layers.
    model.update(
        tree_map(
            lambda p: (p * 0.02).astype(dtype) if p.ndim > 1 else p.astype(dtype),
            model.parameters(),
        )
    )
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(full, config_path=out / "config.json")
    return out
