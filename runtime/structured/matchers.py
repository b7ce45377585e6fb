"""The engine's side of structured output: one llguidance matcher per request with a grammar,
advanced by each token the request emits, and the token masks of a step's rows.

A step whose rows have no grammar does none of this. With grammar rows, the lookahead decoder
advances their matchers by the fed tokens, then fills their masks on a worker thread (in
parallel over the rows, outside the GIL) while it encodes the forward, and applies the masks
to the logits on the device before sampling. A grammar compiles once: each request's matcher
is a copy of the grammar's first one (kept for the last `TEMPLATES` grammars), made off the
step path.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import llguidance.numpy
import mlx.core as mx
import numpy as np

from mlx_paged.structured.grammars import ll_tokenizer

# Bit b of mask word w allows token 32 w + b.
_BITS = mx.arange(32, dtype=mx.int32)
# Compiled grammars kept, most recently used last.
TEMPLATES = 64


class GrammarMatchers:
    """Makes a request's matcher and the masks of a step's rows.

    Args:
        hf_tokenizer: the model's Hugging Face fast tokenizer.
        vocab_size: the width of the model's logits (which may pass the tokenizer's).
    """

    def __init__(self, hf_tokenizer, vocab_size: int):
        self._hf_tokenizer = hf_tokenizer
        self.vocab_size = vocab_size
        self._executor = llguidance.LLExecutor()
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # matchers are made on the threads that submit

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher of `grammar` (checked by the front already): a copy of the one
        compiled for it first."""
        with self._lock:
            template = self._templates.pop(grammar, None)
            if template is None:
                tokenizer = ll_tokenizer(self._hf_tokenizer, self.vocab_size)
                template = llguidance.LLMatcher(tokenizer, grammar)
                if template.is_error():
                    raise ValueError(f"the grammar failed: {template.get_error()}")
            self._templates[grammar] = template
            while len(self._templates) > TEMPLATES:
                self._templates.popitem(last=False)
        return template.deep_copy()

    def masks(self, matchers: Sequence[llguidance.LLMatcher | None]) -> mx.array:
        """`(B, W)` int32 words, bit b of word w allowing token 32 w + b (`constrain`), of the
        tokens each row may sample next (every one for rows whose matcher is None)."""
        return mx.array(self._fill(matchers))

    def start_masks(self, matchers: Sequence[llguidance.LLMatcher | None]) -> Future:
        """`masks` filled on a worker thread (llguidance works outside the GIL), so the caller
        can encode the forward meanwhile; the future's result is the words as a NumPy array."""
        return self._worker.submit(self._fill, list(matchers))

    def _fill(self, matchers: Sequence[llguidance.LLMatcher | None]) -> np.ndarray:
        words = np.full(llguidance.numpy.get_bitmask_shape(len(matchers), self.vocab_size), -1,
                        dtype=np.int32)  # fmt: skip
        rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
        if rows:  # llguidance refuses an empty batch
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, rows, words)
        return words

    def draft_masks(
        self, matchers: Sequence[llguidance.LLMatcher | None], drafts: list[list[int]]
    ) -> np.ndarray:
        """Mask words of a speculative step's query rows: per row, its pending token's and one
        after each drafted token, as if the draft were consumed (each matcher is left as it
        was). A draft is cut before its first token the grammar refuses (in place), and the
        masks after the cut are left out."""
        starts = np.cumsum([0] + [1 + len(d) for d in drafts])
        words = np.full(llguidance.numpy.get_bitmask_shape(int(starts[-1]), self.vocab_size), -1,
                        dtype=np.int32)  # fmt: skip
        rows = [(m, int(s), list(d)) for m, s, d in zip(matchers, starts, drafts) if m is not None]
        drafted = [row for row in rows if row[2]]  # llguidance takes no empty draft there
        if drafted:
            llguidance.numpy.fill_next_token_bitmask_par_with_draft_tokens(
                self._executor, drafted, words
            )
        if len(drafted) < len(rows):
            plain = [(m, s) for m, s, d in rows if not d]
            llguidance.numpy.fill_next_token_bitmask_par(self._executor, plain, words)
        keep = []
        for start, draft in zip(starts, drafts):
            allowed = [words[start + j, t // 32] >> (t % 32) & 1 for j, t in enumerate(draft)]
            if not all(allowed):
                del draft[allowed.index(0) :]
            keep += range(start, start + 1 + len(draft))
        return words[keep]

    @staticmethod
    def consume(tokens: Sequence[tuple[llguidance.LLMatcher, int]]) -> None:
        """Advance each matcher by its emitted token (one by one: a few microseconds each,
        less than waking a thread pool); a token its mask allowed always fits."""
        for matcher, token in tokens:
            if not matcher.consume_token(token):
                raise RuntimeError(f"token {token} left the grammar: {matcher.get_error()}")


@mx.compile
def constrain(logits: mx.array, words: mx.array) -> mx.array:
    """`logits` with every token a row may not sample (a clear bit of its `masks` words) at
    -inf; compiled, so the unpacking and the select are one kernel."""
    bits = (words[:, :, None] >> _BITS) & 1
    allowed = bits.reshape(words.shape[0], -1)[:, : logits.shape[-1]]
    return mx.where(allowed.astype(mx.bool_), logits, mx.array(-mx.inf, logits.dtype))
