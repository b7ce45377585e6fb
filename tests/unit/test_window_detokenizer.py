"""`WindowDetokenizer`: the text it streams is the tokenizer's decode of every token, each new
token decoding a window of a few tokens, never the whole line."""

from __future__ import annotations

import numpy as np
from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer,
    NaiveStreamingDetokenizer,
)
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tiny_models import build_tokenizer

from mlx_paged.engine.window_detokenizer import (
    WindowDetokenizer,
    backend_decode,
    streaming_detokenizer,
)


def word_level_tokenizer():
    """The word-level tokenizer of the benchmarks' random models (mlx-lm streams it naively)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(500)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="w1")


class WindowSizes:
    """The real tokenizer, with the length of every list it decodes written down."""

    def __init__(self, tokenizer):
        self.tokenizer, self.sizes = tokenizer, []

    def decode(self, ids):
        self.sizes.append(len(ids))
        return self.tokenizer.decode(ids)


def stream(detokenizer, tokens) -> list[str]:
    segments = []
    for t in tokens:
        detokenizer.add_token(t)
        segments.append(detokenizer.last_segment)
    detokenizer.finalize()
    segments.append(detokenizer.last_segment)
    return segments


def test_word_level_text_is_the_full_decode_from_two_token_windows():
    tokenizer = word_level_tokenizer()
    tokens = np.random.default_rng(0).integers(2, 500, size=400).tolist()
    spy = WindowSizes(tokenizer)
    segments = stream(WindowDetokenizer(spy), tokens)
    assert "".join(segments) == tokenizer.decode(tokens)
    assert all(segments[:-1]) and segments[1].startswith(" ")  # a word each step, spaced
    assert max(spy.sizes) == 2


def test_characters_split_over_byte_level_tokens_wait_for_their_last_byte(tmp_path):
    tokenizer = build_tokenizer(tmp_path)
    text = "héllo wörld ✓ 日本語 paged 🙂 kv"
    tokens = tokenizer.encode(text)
    segments = stream(WindowDetokenizer(tokenizer), tokens)
    assert "".join(segments) == tokenizer.decode(tokens) == text
    assert not any("\ufffd" in s for s in segments)
    assert segments.count("") > 0  # some tokens were half a character


def test_finalize_lets_an_unfinished_character_out(tmp_path):
    tokenizer = build_tokenizer(tmp_path)
    tokens = tokenizer.encode("a🙂")[:-1]  # the emoji's last byte never comes
    segments = stream(WindowDetokenizer(tokenizer), tokens)
    assert "".join(segments) == tokenizer.decode(tokens) and segments[-1].endswith("\ufffd")


def test_mlx_lms_linear_detokenizers_are_kept(tmp_path):
    """As mlx-lm loads them: its BPE one for byte-level BPE, a window for word-level."""
    build_tokenizer(tmp_path / "bpe")
    word_level_tokenizer().save_pretrained(str(tmp_path / "words"))
    bpe, words = load_tokenizer(tmp_path / "bpe"), load_tokenizer(tmp_path / "words")
    assert isinstance(streaming_detokenizer(bpe), BPEStreamingDetokenizer)
    assert isinstance(words.detokenizer, NaiveStreamingDetokenizer)
    assert isinstance(streaming_detokenizer(words), WindowDetokenizer)


def test_backend_decode_is_the_wrappers_decode_special_tokens_and_all(tmp_path):
    byte_level = build_tokenizer(tmp_path)
    for tokenizer in (word_level_tokenizer(), byte_level):
        tokenizer.clean_up_tokenization_spaces = False
        decode = backend_decode(tokenizer)
        assert decode != tokenizer.decode  # the backend's own
        rng = np.random.default_rng(1)
        for _ in range(50):
            ids = rng.integers(0, len(tokenizer), size=int(rng.integers(1, 12))).tolist()
            assert decode(ids) == tokenizer.decode(ids)
        assert decode([tokenizer.eos_token_id]) == tokenizer.eos_token  # not skipped


def test_a_tokenizer_that_cleans_up_spaces_keeps_the_wrappers_decode():
    tokenizer = word_level_tokenizer()
    tokenizer.clean_up_tokenization_spaces = True
    assert backend_decode(tokenizer) == tokenizer.decode
