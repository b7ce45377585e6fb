"""Tiny random-weight mlx-lm models and a byte-level BPE tokenizer, built offline."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

CORPUS = [
    "hello world", "the quick brown fox jumps over the lazy dog",
    "paged attention kv cache block table", "continuous batching joins and leaves every step",
] * 40

BASE_CONFIG = {
    "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 512,
}
EXTRA = {
    "llama": {},
    "qwen3": {},
    "gemma3_text": {"sliding_window": 8, "sliding_window_pattern": 2,
                    "query_pre_attn_scalar": 16, "rope_local_base_freq": 10000.0},
}


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>",
                                 pad_token="<|pad|>")
    hf.chat_template = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n"
                        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    hf.save_pretrained(str(out))
    return hf


def build_model(out: Path, model_type: str, seed: int = 0, **overrides) -> Path:
    """Write a tiny random `model_type` model with its tokenizer into `out` and return it;
    `overrides` replace config entries (e.g. head_dim=64 for the GPU kernels)."""
    import importlib

    from mlx_lm.utils import save_config, save_model

    out.mkdir(parents=True, exist_ok=True)
    hf = build_tokenizer(out)
    config = {"model_type": model_type, **BASE_CONFIG, **EXTRA[model_type],
              "vocab_size": len(hf), "bos_token_id": hf.bos_token_id,
              "eos_token_id": hf.eos_token_id, **overrides}
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, config_path=out / "config.json")
    return out
