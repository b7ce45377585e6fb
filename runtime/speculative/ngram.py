"""Prompt lookup drafts (vLLM's `ngram` method): the tokens that followed the last time the
sequence's own newest n-gram appeared in it, from its prompt or its output. No weights, no
device work: a vectorized search over the request's token ids on the CPU."""

from __future__ import annotations

import numpy as np


class NgramProposer:
    """Drafts of up to `num_draft_tokens` tokens per request.

    Args:
        num_draft_tokens: most tokens a draft holds (K).
        max_ngram: the longest suffix searched for; longer matches are tried first.
        min_ngram: the shortest suffix that may still draft.
    """

    def __init__(self, num_draft_tokens: int, max_ngram: int = 4, min_ngram: int = 1):
        if num_draft_tokens < 1 or not 1 <= min_ngram <= max_ngram:
            raise ValueError("need num_draft_tokens >= 1 and 1 <= min_ngram <= max_ngram")
        self.num_draft_tokens = num_draft_tokens
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        # Per request: its token ids so far in a growing buffer, and how many are filled.
        self._tokens: dict[str, tuple[np.ndarray, int]] = {}

    def propose(self, request, tail: list[int], limit: int) -> list[int]:
        """Up to `min(limit, K)` tokens that may follow `request`'s prompt, its output and
        `tail` (tokens sampled but not yet in its output), or none where no suffix of that
        sequence appeared in it before."""
        limit = min(limit, self.num_draft_tokens)
        if limit < 1:
            return []
        tokens = self._sequence(request, tail)
        # Where an earlier token equals the last one, a match ends there; grow each candidate's
        # match backwards, then the longest one (the most recent among equals) drafts.
        ends = np.flatnonzero(tokens[:-1] == tokens[-1])
        lengths = np.ones(len(ends), np.int64)
        for k in range(1, min(self.max_ngram, len(tokens) - 1)):
            grown = (lengths == k) & (ends >= k)
            grown[grown] = tokens[ends[grown] - k] == tokens[-1 - k]
            lengths += grown
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            found = ends[lengths >= n]
            if len(found):
                follow = found[-1] + 1  # after the most recent earlier occurrence
                return tokens[follow : follow + limit].tolist()
        return []

    def propose_batch(self, requests, tails: list[list[int]], limits: list[int]):
        """`propose` for each request."""
        return [self.propose(r, t, n) for r, t, n in zip(requests, tails, limits)]

    def accept(self, request, num_tokens: int) -> None:
        """Nothing to roll back: drafts come from the request's own tokens."""

    def forget(self, request_id: str) -> None:
        """Drop a finished request's buffer."""
        self._tokens.pop(request_id, None)

    def _sequence(self, request, tail: list[int]) -> np.ndarray:
        """The request's prompt and output in its buffer (appending only what is new since
        the last call), with `tail` after them, uncommitted."""
        prompt, output = request.prompt_token_ids, request.output_token_ids
        total = len(prompt) + len(output)
        buffer, filled = self._tokens.get(request.request_id, (None, 0))
        if buffer is None or total + len(tail) > len(buffer):
            grown = np.empty(2 * (total + len(tail)) + 64, np.int64)
            if buffer is not None:
                grown[:filled] = buffer[:filled]
            buffer = grown
        if filled < len(prompt):
            buffer[filled : len(prompt)] = prompt[filled:]
            filled = len(prompt)
        buffer[filled:total] = output[filled - len(prompt) :]
        buffer[total : total + len(tail)] = tail
        self._tokens[request.request_id] = (buffer, total)
        return buffer[: total + len(tail)]
