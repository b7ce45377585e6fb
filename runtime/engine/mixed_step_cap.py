"""While streams decode, a step with prompt work is every stream's inter-token gap: the cap
keeps that step within `ratio` times a decode-only step.

Such a step costs a fixed part (its decode rows, the eager forward that carries the chunks)
plus a part per prompt token, so the cap fits `seconds = fixed + per_token * tokens` to recent
steps by least squares and offers the tokens that fit the target. A fixed part near the target
must not starve prompts: the prompt work may always take a third of the step
(`fixed / (2 * per_token)` tokens). Until steps of different sizes are measured, the cap starts
at `FIRST_TOKENS` and doubles, so that the first steps do not stall every stream; before any
decode-only step, a decode step is taken to cost the fixed part.
"""

from __future__ import annotations

import statistics
from collections import deque

FIRST_TOKENS = 256  # the first step's prompt tokens while streams decode, before any fit
ALIGN_TOKENS = 64  # the cap is a multiple of this (chunks the scheduler cuts stay aligned)
DECODE_STEPS_KEPT = 9  # recent decode-only steps whose median is "a decode step"
MIXED_STEPS_KEPT = 32  # recent steps with prompt work that the fit reads


class MixedStepCap:
    """Prompt tokens the next step may run beside decoding streams.

    Args:
        ratio: how many decode-only steps' time a step with prompt work may take (> 1).
    """

    def __init__(self, ratio: float):
        if not ratio > 1:
            raise ValueError(f"the ratio of a step with prompt work must exceed 1, got {ratio}")
        self.ratio = ratio
        self.decode_steps: deque[float] = deque(maxlen=DECODE_STEPS_KEPT)
        self.mixed_steps: deque[tuple[int, float]] = deque(maxlen=MIXED_STEPS_KEPT)
        self._last_fit: tuple[float, float] | None = None

    def observe_decode(self, seconds: float) -> None:
        """Record a decode-only step."""
        self.decode_steps.append(seconds)

    def observe_mixed(self, prompt_tokens: int, seconds: float) -> None:
        """Record a step that ran `prompt_tokens` prompt tokens beside decode rows."""
        self.mixed_steps.append((prompt_tokens, seconds))

    @property
    def budget(self) -> int:
        """Prompt tokens for the next step that runs beside decode rows."""
        fit = self.fit()
        if fit is None:  # no sizes that differ yet: twice the largest, so the next ones do
            return max(FIRST_TOKENS, 2 * max((n for n, _ in self.mixed_steps), default=0))
        fixed, per_token = fit
        decode = statistics.median(self.decode_steps) if self.decode_steps else fixed
        tokens = max(self.ratio * decode - fixed, fixed / 2) / per_token
        return max(ALIGN_TOKENS, int(tokens) // ALIGN_TOKENS * ALIGN_TOKENS)

    def fit(self) -> tuple[float, float] | None:
        """`(fixed seconds, seconds a prompt token)` of recent steps with prompt work, by least
        squares once their sizes differ by half and one reached `FIRST_TOKENS` (a few tokens'
        cost is lost in a step's noise); until then, or where the slope comes out non-positive,
        the last good fit (None before one)."""
        sizes = [n for n, _ in self.mixed_steps]
        if len(sizes) < 2 or 2 * max(sizes) < 3 * min(sizes) or max(sizes) < FIRST_TOKENS:
            return self._last_fit
        mean_n = statistics.fmean(sizes)
        mean_s = statistics.fmean(s for _, s in self.mixed_steps)
        spread = sum((n - mean_n) ** 2 for n in sizes)
        per_token = sum((n - mean_n) * (s - mean_s) for n, s in self.mixed_steps) / spread
        if per_token > 0:
            self._last_fit = (max(mean_s - per_token * mean_n, 0.0), per_token)
        return self._last_fit
