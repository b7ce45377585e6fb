"""While streams decode, a step with prompt work is every stream's inter-token gap: the cap
keeps that step within `ratio` times a decode-only step.

Such a step costs a fixed part (its decode rows, the eager forward that carries the chunks)
plus a part per prompt token, so the cap fits `seconds = fixed + per_token * tokens` to recent
steps and offers the tokens that fit the target. The fit is Theil-Sen's (the median slope of
pairs of steps whose sizes differ by half, then the median intercept): one step that met a new
kernel or graph and took a second must not tilt it. A fixed part near the target must not
starve prompts: the prompt work may always take a third of the step (`fixed / (2 *
per_token)` tokens). Until two sizes are measured the cap explores from `FIRST_TOKENS`: half
the last step's size where that step overran the target, twice it where it did not, so the
sizes differ at once; before any decode-only step, a decode step is taken to cost the fixed
part. After a fit, where recent steps are all of about one size and the last kept to the target,
the cap offers `SPLIT` times it (a probe), so that a fit gone wrong meets a pair again.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque

FIRST_TOKENS = 256  # the first step's prompt tokens while streams decode, before any fit
ALIGN_TOKENS = 64  # the cap is a multiple of this (chunks the scheduler cuts stay aligned)
DECODE_STEPS_KEPT = 9  # recent decode-only steps whose median is "a decode step"
MIXED_STEPS_KEPT = 32  # recent steps with prompt work that the fit reads
SPLIT = 1.5  # two steps' sizes this far apart tell the fixed part from the per-token one


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
        self._paired = False  # some pair of recent steps told the fit's parts apart

    def observe_decode(self, seconds: float) -> None:
        """Record a decode-only step."""
        self.decode_steps.append(seconds)

    def observe_mixed(self, prompt_tokens: int, seconds: float) -> None:
        """Record a step that ran `prompt_tokens` prompt tokens beside decode rows, and fit the
        recent ones again (here, not in every step's `budget`: the pairs are a few hundred)."""
        self.mixed_steps.append((prompt_tokens, seconds))
        self._refit()

    @property
    def budget(self) -> int:
        """Prompt tokens for the next step that runs beside decode rows."""
        fit = self.fit()
        if fit is None:
            return self._explore()
        fixed, per_token = fit
        decode = statistics.median(self.decode_steps) if self.decode_steps else fixed
        tokens = max(self.ratio * decode - fixed, fixed / 2) / per_token
        return max(_aligned(tokens), self._probe(decode))

    def _probe(self, decode: float) -> int:
        """Where no pair of recent steps tells the parts apart and the last step kept to the
        target, `SPLIT` times its size (rounded up to `ALIGN_TOKENS`): a pair again, so a slope
        that settled too steep while the cap held every step to one size is corrected."""
        if self._paired:
            return 0
        tokens, seconds = self.mixed_steps[-1]
        if seconds > self.ratio * decode:
            return 0
        return -int(-SPLIT * tokens // ALIGN_TOKENS) * ALIGN_TOKENS

    def _explore(self) -> int:
        """Before a fit: `FIRST_TOKENS`, then half or twice the last step's size, whichever
        keeps to the target (twice, before a decode step is known)."""
        if not self.mixed_steps:
            return FIRST_TOKENS
        tokens, seconds = self.mixed_steps[-1]
        tokens = max(tokens, FIRST_TOKENS)
        overran = self.decode_steps and seconds > self.ratio * statistics.median(self.decode_steps)
        return _aligned(tokens / 2 if overran else 2 * tokens)

    def fit(self) -> tuple[float, float] | None:
        """`(fixed seconds, seconds a prompt token)` of recent steps with prompt work (None
        before a good fit)."""
        return self._last_fit

    def _refit(self) -> None:
        """The median slope over pairs whose sizes differ by `SPLIT` and whose larger one
        reached `FIRST_TOKENS` (a few tokens' cost is lost in a step's noise), then the median
        intercept. Where no pair qualifies (recent steps all of one size, as the cap makes
        them) or the slope is not positive, the last good slope stays and the intercept follows
        the recent steps: else a fit from dearer steps long past would hold the cap down."""
        slopes = [(s2 - s1) / (n2 - n1)
                  for (n1, s1), (n2, s2) in itertools.combinations(self.mixed_steps, 2)
                  if max(n1, n2) >= max(SPLIT * min(n1, n2), FIRST_TOKENS)]  # fmt: skip
        self._paired = bool(slopes)
        per_token = statistics.median(slopes) if slopes else 0.0
        if per_token <= 0:
            if self._last_fit is None:
                return
            per_token = self._last_fit[1]
        fixed = statistics.median(s - per_token * n for n, s in self.mixed_steps)
        self._last_fit = (max(fixed, 0.0), per_token)


def _aligned(tokens: float) -> int:
    return max(ALIGN_TOKENS, int(tokens) // ALIGN_TOKENS * ALIGN_TOKENS)
