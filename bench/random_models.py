"""Models of a given size with random weights, written offline, for benchmarks that need real
model code but no real checkpoint: a ~1B llama, and a ~1B hybrid shaped like Qwen3.5 (Gated
DeltaNet layers, every 4th layer full attention). Their tokenizer is word-level (`w0`, `w1`,
...), or byte-level BPE trained on the Python standard library's sources where a benchmark needs
text of any shape, such as JSON."""

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


QWEN3_5_1B = {
    "hidden_size": 2048,
    "num_hidden_layers": 24,
    "intermediate_size": 4096,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 16,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "full_attention_interval": 4,
    "vocab_size": 32000,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
}

# name -> (mlx-lm model type, config, what the results call it)
RANDOM_MODELS = {
    "llama-1b": ("llama", ONE_B, "random llama 1B (hidden 2048, 16 layers, 32/8 heads, bf16)"),
    "qwen3_5-1b": (
        "qwen3_5",
        QWEN3_5_1B,
        "random Qwen3.5-like hybrid 1B (hidden 2048, 24 layers: 18 Gated DeltaNet, 6 full "
        "attention at 8/2 heads of 256, bf16)",
    ),
}


def build_random_model(out: Path, name: str, dtype=mx.bfloat16, seed: int = 0) -> Path:
    """Write the `RANDOM_MODELS[name]` folder into `out`; returns `out`."""
    model_type, config, _ = RANDOM_MODELS[name]
    return build_random_llama(out, config, dtype, seed, model_type)


def build_random_llama(
    out: Path,
    config: dict = ONE_B,
    dtype=mx.bfloat16,
    seed: int = 0,
    model_type: str = "llama",
    byte_level: bool = False,
) -> Path:
    """Write an mlx-lm `model_type` folder with random `dtype` weights into `out`, with a
    word-level tokenizer or (`byte_level`) a byte-level BPE one of the config's vocabulary
    size; returns `out`."""
    import importlib

    from mlx.utils import tree_map
    from mlx_lm.utils import save_config, save_model
    from transformers import PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    make = _byte_level_tokenizer if byte_level else _word_level_tokenizer
    tok, eos = make(config["vocab_size"])
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos).save_pretrained(str(out))
    full = {"model_type": model_type, **config, "eos_token_id": 1}
    module = importlib.import_module(f"mlx_lm.models.{model_type}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(full))
    # Small weights keep activations finite through many random layers.
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


def _word_level_tokenizer(vocab_size: int):
    """Words `w0`..`w{vocab_size - 1}` split on whitespace; (tokenizer, its EOS `w1`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok, "w1"


def _byte_level_tokenizer(vocab_size: int, corpus_bytes: int = 8 << 20):
    """Byte-level BPE of exactly `vocab_size` tokens, trained on the first `corpus_bytes` of
    the standard library's sources (any text encodes; id 1 is its EOS `</s>`)."""
    import sysconfig

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def corpus():
        seen = 0
        for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
            text = path.read_text(errors="replace")
            yield text
            seen += len(text)
            if seen >= corpus_bytes:
                return

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(corpus(), trainer)
    if tok.get_vocab_size() != vocab_size:  # the model's logits must match the vocabulary
        raise RuntimeError(f"the corpus gave {tok.get_vocab_size()} tokens, not {vocab_size}")
    return tok, "</s>"
