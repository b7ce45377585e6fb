"""Convert a llama-architecture GGUF file into an mlx-lm model folder.

Q4_0 / Q4_1 / Q8_0 blocks are re-packed bit-exactly into MLX affine quantization (group 32) with
float32 scales; F32/F16 tensors are copied. Q/K rows are un-permuted back to the rotate-half RoPE
layout mlx-lm expects, and the GGUF vocabulary becomes a `tokenizers` byte-level BPE tokenizer.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mlx_paged.progress import progress

logger = logging.getLogger("mlx_paged.models")

GROUP_SIZE = 32  # GGUF block size for Q4_0 / Q4_1 / Q8_0.

# llama.cpp tensor name -> HF / mlx-lm parameter name ("{}" is the layer index).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

Progress = Callable[[str], None]


def hf_name(gguf_name: str) -> str:
    """Map a llama.cpp tensor name (`blk.3.attn_q.weight`) to its mlx-lm name."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        layer, base, suffix = parts[1], parts[2], ".".join(parts[3:])
        return f"model.layers.{layer}.{_LAYER_NAMES[base]}.{suffix}"
    base, suffix = parts[0], ".".join(parts[1:])
    return f"{_GLOBAL_NAMES[base]}.{suffix}"


def unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE -> rotate-half).

    Works on any per-row payload (float rows or packed quantized rows), since it only moves rows.
    """
    out_features = rows.shape[0]
    half = out_features // num_heads // 2
    tail = rows.shape[1:]
    return rows.reshape(num_heads, half, 2, *tail).swapaxes(1, 2).reshape(rows.shape)


def _pack_uint32(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack unsigned ints (rows, cols) into MLX's little-endian uint32 words, lowest value first."""
    per_word = 32 // bits
    rows, cols = values.shape
    v = values.astype(np.uint32).reshape(rows, cols // per_word, per_word)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    return np.bitwise_or.reduce(v << shifts, axis=-1)


def requantize(
    raw: np.ndarray, qtype: str, cols: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Re-pack GGUF Q4_0/Q4_1/Q8_0 rows as MLX affine (weight, scales, biases, bits).

    Each GGUF block of 32 values becomes one MLX group: w = scale * q + bias, exactly.
    """
    rows = raw.shape[0]
    nblocks = cols // GROUP_SIZE
    if qtype in ("Q4_0", "Q4_1"):
        head = 2 if qtype == "Q4_0" else 4
        blocks = raw.reshape(rows, nblocks, head + 16)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[..., head:]
        # Byte i holds element i in its low nibble and element i + 16 in its high nibble.
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
        if qtype == "Q4_1":
            bias = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
        else:
            bias = -8.0 * d
        return _pack_uint32(q, 4), d, bias, 4
    if qtype == "Q8_0":
        blocks = raw.reshape(rows, nblocks, 34)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).reshape(rows, cols)
        return _pack_uint32(q, 8), d, -128.0 * d, 8
    raise ValueError(f"tensor type {qtype} cannot be kept quantized; supported: Q4_0, Q4_1, Q8_0")


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _build_config(reader, has_output: bool, quantization: dict) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r} is not supported; only 'llama' is")
    n_heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", n_heads)),
        "head_dim": int(_field(reader, "llama.rope.dimension_count", hidden // n_heads)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "vocab_size": len(reader.fields["tokenizer.ggml.tokens"].data),
        "tie_word_embeddings": not has_output,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "float32",
    }
    if quantization:
        config["quantization"] = quantization
    return config


def _build_tokenizer(reader, out: Path) -> None:
    """Write tokenizer.json / tokenizer_config.json / chat template from the GGUF vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ValueError("only byte-level BPE ('gpt2') GGUF vocabularies are supported")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False))
    # SmolLM's pre-tokenizer: every digit alone, then the GPT-2 byte-level regex split.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    control = [t for t, kind in zip(tokens, types) if kind == 3]  # GGUF token type 3 = control
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])

    def name(key):
        idx = _field(reader, key)
        return None if idx is None else tokens[int(idx)]

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"),
        unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"),
        clean_up_tokenization_spaces=False,
    )
    template = _field(reader, "tokenizer.chat_template")
    if template:
        hf.chat_template = template
    hf.save_pretrained(str(out))


def convert_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    unpermute_qk: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Convert `gguf_path` into an mlx-lm folder at `out_dir` (written atomically).

    Args:
        gguf_path: a llama-architecture GGUF with F32/F16/Q4_0/Q4_1/Q8_0 tensors.
        out_dir: destination folder; it must not exist yet.
        unpermute_qk: undo llama.cpp's Q/K permutation. Only tests turn this off, to prove
            that the perplexity check catches a broken conversion.
        progress: called with short human-readable status lines.

    Returns:
        The path of the finished folder.
    """
    import gguf

    say = progress or (lambda _msg: None)
    out_dir = Path(out_dir)
    reader = gguf.GGUFReader(str(gguf_path))
    weights, quantization = _convert_tensors(reader, unpermute_qk)
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    config = _build_config(reader, has_output, _quantization_config(quantization))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".", dir=out_dir.parent))
    try:
        _write_folder(tmp, reader, weights, config, say)
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _convert_tensors(reader, unpermute_qk: bool) -> tuple[dict, dict]:
    """(mlx-lm weights, per-layer quantization) of every tensor in `reader`."""
    import mlx.core as mx

    n_heads = int(_field(reader, "llama.attention.head_count"))
    n_kv_heads = int(_field(reader, "llama.attention.head_count_kv", n_heads))
    weights: dict[str, mx.array] = {}
    quantization: dict = {}
    for tensor in progress(reader.tensors, "converting GGUF tensors", unit="tensor", log=logger):
        name = hf_name(tensor.name)
        qtype = tensor.tensor_type.name
        cols = int(tensor.shape[0])  # ggml lists the fastest-moving dimension first
        data = np.asarray(tensor.data)
        if unpermute_qk and ".q_proj." in name:
            data = unpermute_rows(data, n_heads)
        elif unpermute_qk and ".k_proj." in name:
            data = unpermute_rows(data, n_kv_heads)
        prefix = name.rsplit(".", 1)[0]
        if qtype in ("F32", "F16"):
            weights[name] = mx.array(data.astype(np.float32))
        else:
            packed, scales, biases, bits = requantize(data, qtype, cols)
            weights[name] = mx.array(packed)
            weights[f"{prefix}.scales"] = mx.array(scales)
            weights[f"{prefix}.biases"] = mx.array(biases)
            quantization[prefix] = {"group_size": GROUP_SIZE, "bits": bits}
    return weights, quantization


def _quantization_config(quantization: dict) -> dict:
    """mlx-lm wants one default entry plus per-layer overrides for other bit widths."""
    default_bits = max(
        set(q["bits"] for q in quantization.values()),
        key=lambda b: sum(q["bits"] == b for q in quantization.values()),
        default=None,
    )
    if default_bits is None:
        return {}
    config = {"group_size": GROUP_SIZE, "bits": default_bits}
    config.update({p: q for p, q in quantization.items() if q["bits"] != default_bits})
    return config


def _write_folder(tmp: Path, reader, weights: dict, config: dict, say: Progress) -> None:
    import mlx.core as mx

    say("writing weights")
    mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    say("building tokenizer")
    _build_tokenizer(reader, tmp)
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
