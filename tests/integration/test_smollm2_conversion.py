"""The embedded SmolLM2 conversion is exact and would be caught if it broke."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlx_paged.models.default_model import locate_gguf
from mlx_paged.models.gguf_convert import convert_gguf, requantize

PARAGRAPH = (
    "Paris is the capital and largest city of France. With an estimated population of over two "
    "million residents, it is the centre of the Paris metropolitan area. The city is known for "
    "its museums, architecture and cafes, and it has been one of the world's major centres of "
    "finance, diplomacy, commerce, fashion and science since the seventeenth century."
)


def perplexity(model, tokenizer) -> float:
    ids = mx.array(tokenizer.encode(PARAGRAPH))[None]
    logits = model(ids[:, :-1]).astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    nll = -mx.take_along_axis(logprobs, ids[:, 1:, None], axis=-1).mean()
    return math.exp(nll.item())


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    from mlx_lm import load

    return load(str(smollm2_dir))


def test_requantized_blocks_dequantize_exactly_like_gguf():
    import gguf

    reader = gguf.GGUFReader(str(locate_gguf()))
    seen = set()
    for tensor in reader.tensors:
        qtype = tensor.tensor_type.name
        if qtype in seen or qtype not in ("Q4_1", "Q8_0"):
            continue
        seen.add(qtype)
        raw = np.asarray(tensor.data)[:64]
        cols = int(tensor.shape[0])
        packed, scales, biases, bits = requantize(raw, qtype, cols)
        ours = mx.dequantize(
            mx.array(packed), mx.array(scales), mx.array(biases), group_size=32, bits=bits
        )
        reference = gguf.quants.dequantize(raw, tensor.tensor_type).reshape(64, cols)
        np.testing.assert_array_equal(np.array(ours), reference.astype(np.float32))
    assert seen == {"Q4_1", "Q8_0"}


def test_greedy_chat_answer_and_tokenizer(smollm2):
    from mlx_lm import generate

    model, tokenizer = smollm2
    assert tokenizer.encode("<|im_start|>system\nhi")[:3] == [1, 9690, 198]
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True
    )
    assert generate(model, tokenizer, prompt, max_tokens=20) == "The capital of France is Paris."


def test_perplexity_is_right_and_a_broken_conversion_is_caught(smollm2, tmp_path):
    from mlx_lm import load

    good = perplexity(*smollm2)
    assert 8.0 < good < 12.0  # measured 9.98 on this paragraph
    broken_dir = convert_gguf(locate_gguf(), tmp_path / "no-unpermute", unpermute_qk=False)
    broken = perplexity(*load(str(broken_dir)))
    assert broken > 2 * good  # measured 28.7 without the Q/K un-permute


def test_second_start_reuses_the_cache(smollm2_dir):
    from mlx_paged.models.default_model import default_model_path

    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert default_model_path() == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before
