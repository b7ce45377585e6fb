"""Prompt chunks sized by time, so that no step runs much longer than `prefill_chunk_seconds`,
nor, while streams decode, much longer than a decode step (`prefill_itl_ratio`).

A step is the engine's unit of attention: a hang-up, an abort, a new request and every other
stream's next token wait for it to end. A fixed token budget cannot serve both a GPU that
prefills 2,048 tokens in 50 ms and a CPU that needs 0.1 s a token. So the pacer measures what a
step's tokens cost (prompt chunks and decode rows alike) and offers the next step the tokens
that fit the target: a power of two (few distinct attention shapes), at least `MIN_TOKENS`.
While streams decode, a step with prompt work is every stream's inter-token gap: it also fits
`prefill_itl_ratio` times the median recent decode-only step, so prompts arriving together
enter over several steps instead of stalling every stream in one.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

MIN_TOKENS = 4  # prompts always progress, whatever a token costs
SMOOTHING = 0.5  # weight of a dearer step in the seconds-per-token estimate
DECODE_STEPS_KEPT = 9  # recent decode-only steps whose median is "a decode step"


def _floor_pow2(n: float) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


class StepPacer:
    """The token budget of the next step.

    Args:
        target_seconds: how long a step with prompt work may take; None turns pacing off.
        max_tokens: the budget's ceiling (the scheduler's own limits still apply).
        itl_ratio: while streams decode, how many decode steps' time a step with prompt work
            may take; None: only `target_seconds` applies.
    """

    def __init__(self, target_seconds: float | None, max_tokens: int,
                 itl_ratio: float | None = None):  # fmt: skip
        self.target_seconds = target_seconds
        self.max_tokens = max(max_tokens, MIN_TOKENS)
        self.itl_ratio = itl_ratio
        self.seconds_per_token: float | None = None
        self.decode_steps: deque[float] = deque(maxlen=DECODE_STEPS_KEPT)

    @property
    def budget(self) -> int | None:
        """Tokens the next step may run (None: no pacing). Before any measurement, the
        floor: the first step of a slow device must not be the one that stalls."""
        return self._fit(self.target_seconds)

    @property
    def decoding_budget(self) -> int | None:
        """Tokens the next step may run while streams decode (their rows included): within
        `budget`, and within `itl_ratio` decode steps once one has been timed."""
        if self.target_seconds is None or self.itl_ratio is None or not self.decode_steps:
            return self.budget
        itl_seconds = self.itl_ratio * statistics.median(self.decode_steps)
        return self._fit(min(self.target_seconds, itl_seconds))

    def _fit(self, seconds: float | None) -> int | None:
        if seconds is None:
            return None
        if self.seconds_per_token is None:
            return MIN_TOKENS
        fit = seconds / self.seconds_per_token
        return max(MIN_TOKENS, min(_floor_pow2(fit), _floor_pow2(self.max_tokens)))

    def observe(self, num_tokens: int, seconds: float) -> None:
        """Record a step that ran `num_tokens` tokens (prompt and decode) in `seconds`."""
        if self.target_seconds is None or num_tokens < 1 or seconds <= 0:
            return
        cost = seconds / num_tokens
        old = self.seconds_per_token
        # A cheaper token is believed at once (larger chunks amortise a step's fixed cost, so
        # the budget climbs in a few steps); a dearer one halfway (one slow step, a graph
        # build, must not collapse the budget).
        if old is None or cost < old:
            self.seconds_per_token = cost
        else:
            self.seconds_per_token = old + SMOOTHING * (cost - old)

    def mark(self, metrics) -> tuple[int, int, float, int | None, int | None]:
        """What `after_step` compares with: the engine's token counters, the time now and the
        budgets the step runs under (without and with decode rows)."""
        return (metrics.prompt_tokens_total, metrics.generation_tokens_total,
                time.perf_counter(), self.budget, self.decoding_budget)  # fmt: skip

    def after_step(self, metrics, mark: tuple) -> tuple[int | None, int | None]:
        """Observe the step since `mark`: a decode-only step's time, or, if it had prompt work
        and its tokens (prompt and decode rows) filled at least half its budget, its cost a
        token (a step of a few tokens, prompts' last tokens, costs mostly its fixed overhead
        and would undersize the next chunks). Returns the next `budget` and
        `decoding_budget`."""
        prompt, generated, tic, budget, decoding_budget = mark
        seconds = time.perf_counter() - tic
        num_prompt = metrics.prompt_tokens_total - prompt
        num_generated = metrics.generation_tokens_total - generated
        if num_prompt == 0 and num_generated > 0:
            self.decode_steps.append(seconds)
        ran_under = decoding_budget if num_generated > 0 else budget
        num_tokens = num_prompt + num_generated
        if ran_under is not None and num_prompt > 0 and 2 * num_tokens >= ran_under:
            self.observe(num_tokens, seconds)
        return self.budget, self.decoding_budget
