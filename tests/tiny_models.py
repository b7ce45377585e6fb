"""Tiny random-weight mlx-lm models and a byte-level BPE tokenizer, built offline."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from tiny_configs import BASE_CONFIG, EXTRA, VARIANTS, WRAPPERS

CORPUS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "paged attention kv cache block table",
    "continuous batching joins and leaves every step",
] * 40

THINKING_TEMPLATE = (
    "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: "
    "{% if enable_thinking is not defined or enable_thinking %}<think>\n{% endif %}{% endif %}"
)


def build_tokenizer(out: Path, thinking: bool = False):
    """The tiny byte-level BPE tokenizer; with `thinking`, `<think>` and `</think>` tokens and
    a template that opens a thinking block unless `enable_thinking` is false."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|eos|>", pad_token="<|pad|>"
    )
    hf.chat_template = (
        "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
    )
    if thinking:
        hf.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
        hf.chat_template = THINKING_TEMPLATE
    hf.save_pretrained(str(out))
    return hf


def build_model(
    out: Path,
    model_type: str,
    seed: int = 0,
    dtype: mx.Dtype | None = None,
    thinking: bool = False,
    **overrides,
) -> Path:
    """Write a tiny random `model_type` model with its tokenizer into `out` and return it;
    `dtype` casts its weights, `overrides` replace config entries (e.g. head_dim=64 for the GPU
    kernels). "type@variant" applies `VARIANTS[variant]` first. `thinking`: a tokenizer with
    thinking markers (`build_tokenizer`)."""
    import importlib

    from mlx_lm.utils import MODEL_REMAPPING, save_config, save_model

    model_type, _, variant = model_type.partition("@")
    overrides = {**VARIANTS.get(variant, {}), **overrides}
    out.mkdir(parents=True, exist_ok=True)
    hf = build_tokenizer(out, thinking)
    outer, _, inner = model_type.partition(":")
    config = {
        "model_type": inner or outer,
        **BASE_CONFIG,
        **EXTRA[inner or outer],
        "vocab_size": len(hf),
        "bos_token_id": hf.bos_token_id,
        "eos_token_id": hf.eos_token_id,
        **overrides,
    }
    if inner:
        if outer not in WRAPPERS:
            raise ValueError(f"{outer} is not a known wrapper family")
        config = {
            "model_type": outer,
            "text_config": config,
            "vocab_size": len(hf),
            "eos_token_id": hf.eos_token_id,
        }
    # mlx-lm loads some model types with another family's code, as `mlx_lm.utils` maps them.
    module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(outer, outer)}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict(config))
    if dtype is not None:
        model.set_dtype(dtype)
    mx.eval(model.parameters())
    save_model(out, model)
    save_config(config, config_path=out / "config.json")
    return out


def mlx_lm_greedy(model, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """Each prompt alone through mlx-lm's own `generate_step`, greedy: the tokens the paged
    path must reproduce."""
    from mlx_lm.generate import generate_step

    return [
        [int(t) for (t, _), _ in zip(generate_step(mx.array(p), model), range(max_tokens))]
        for p in prompts
    ]
