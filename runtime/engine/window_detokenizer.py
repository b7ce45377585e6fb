"""Incremental detokenization at a bounded cost per token, for tokenizers mlx-lm streams with
its `NaiveStreamingDetokenizer`, which decodes every token since the last newline again on each
new token (quadratic in a line's length: at 64 streams of 500 tokens, milliseconds a step).

Each new token decodes a short window instead: the last token already turned into text (its
context: the space before a word, a character split over tokens) and the tokens after it. The
text the new tokens add is the window's text past the context's own.
"""

from __future__ import annotations

from functools import partial

from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer


class WindowDetokenizer:
    """mlx-lm's streaming detokenizer interface (`add_token`, `last_segment`, `finalize`).

    Args:
        tokenizer: a Hugging Face tokenizer (its `decode`).
    """

    def __init__(self, tokenizer):
        self._decode = backend_decode(tokenizer)
        self.tokens: list[int] = []
        self._start = 0  # first token of the window: context, already in the text
        self._read = 0  # tokens before this one are in the text
        self._pending = ""

    def add_token(self, token: int) -> None:
        self.tokens.append(token)
        self._advance(final=False)

    def finalize(self) -> None:
        """Text held back (an unfinished UTF-8 sequence) comes out, replacement marks and all."""
        self._advance(final=True)

    @property
    def last_segment(self) -> str:
        """The text added since the last call."""
        segment, self._pending = self._pending, ""
        return segment

    def _advance(self, final: bool) -> None:
        if self._read == len(self.tokens):
            return
        context = self._decode(self.tokens[self._start : self._read]) if self._read else ""
        text = self._decode(self.tokens[self._start :])
        if not final and (text.endswith("\ufffd") or len(text) <= len(context)):
            return  # a character split over tokens, or nothing to show yet: wait for more
        self._pending += text[len(context) :]
        self._start, self._read = self._read, len(self.tokens)


def backend_decode(tokenizer):
    """`tokenizer.decode`, or the same through the Rust backend's own decode where the Hugging
    Face wrapper adds nothing to it (no clean-up of spaces): a tenth of the cost a call, which
    at 64 streams is a millisecond a step."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode
    return partial(backend.decode, skip_special_tokens=False)


def streaming_detokenizer(tokenizer):
    """A fresh streaming detokenizer for mlx-lm's `TokenizerWrapper` `tokenizer`: mlx-lm's own
    where it has a linear one (BPE, SentencePiece), else a `WindowDetokenizer`."""
    detokenizer = tokenizer.detokenizer
    if isinstance(detokenizer, NaiveStreamingDetokenizer):
        return WindowDetokenizer(tokenizer._tokenizer)
    return detokenizer
