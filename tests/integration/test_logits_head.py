"""The model split at its logits head gives the model's own logits, and refuses a head it does
not know (so a mixed decode forward never samples from logits the model would not give)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load

from mlx_paged.runner.logits_head import split_logits_head


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3_text", "mistral3:ministral3"])
def test_the_split_gives_the_models_logits(tiny_model_dir, model_type):
    model, _ = load(str(tiny_model_dir(model_type)))
    split = split_logits_head(model)
    assert split is not None
    tokens = mx.array([[7, 3, 9, 11, 2], [4, 4, 5, 6, 1]])
    expected = model(tokens)
    got = split.head(split.body(tokens, cache=None))
    assert mx.array_equal(got, expected).item()


def test_a_head_that_changes_the_logits_is_refused(tiny_model_dir):
    model, _ = load(str(tiny_model_dir("llama")))
    plain = type(model).__call__

    class Softcapped(type(model)):
        def __call__(self, inputs, cache=None, input_embeddings=None):
            return 30 * mx.tanh(plain(self, inputs, cache, input_embeddings) / 30)

    model.__class__ = Softcapped
    assert split_logits_head(model) is None
