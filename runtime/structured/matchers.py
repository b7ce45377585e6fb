"""The engine's side of structured output: one llguidance matcher per request with a grammar,
advanced by each token the request emits, and the token masks of a step's rows.

A step whose rows have no grammar does none of this. With grammar rows, the lookahead decoder
fills their masks on the CPU (in parallel, outside the GIL) while the device runs the forward,
then applies them to those rows' logits on the device before sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.numpy
import mlx.core as mx
import numpy as np

from mlx_paged.structured.grammars import ll_tokenizer

# Bit b of mask word w allows token 32 w + b.
_BITS = mx.arange(32, dtype=mx.int32)


class GrammarMatchers:
    """Makes a request's matcher and the masks of a step's rows.

    Args:
        hf_tokenizer: the model's Hugging Face fast tokenizer.
        vocab_size: the width of the model's logits (which may pass the tokenizer's).
    """

    def __init__(self, hf_tokenizer, vocab_size: int):
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self._executor: llguidance.LLExecutor | None = None

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher of `grammar` (checked by the front already)."""
        tokenizer = ll_tokenizer(self._hf_tokenizer, self.vocab_size)
        matcher = llguidance.LLMatcher(tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(f"the grammar failed: {matcher.get_error()}")
        return matcher

    def masks(self, matchers: Sequence[llguidance.LLMatcher | None]) -> mx.array:
        """`(B, V)` booleans: the tokens each row may sample next (every one for rows whose
        matcher is None)."""
        words = np.full(llguidance.numpy.get_bitmask_shape(len(matchers), self.vocab_size), -1,
                        dtype=np.int32)  # fmt: skip
        rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        llguidance.numpy.fill_next_token_bitmask_par(self._executor, rows, words)
        bits = (mx.array(words)[:, :, None] >> _BITS) & 1
        return bits.reshape(len(matchers), -1)[:, : self.vocab_size].astype(mx.bool_)


def constrain(logits: mx.array, allowed: mx.array) -> mx.array:
    """`logits` with every token a row may not sample at -inf."""
    return mx.where(allowed, logits, mx.array(-mx.inf, logits.dtype))


def consume(matcher: llguidance.LLMatcher, token: int) -> None:
    """Advance `matcher` by an emitted token; a token its mask allowed always fits."""
    if not matcher.consume_token(token):
        raise RuntimeError(f"token {token} left the grammar: {matcher.get_error()}")
