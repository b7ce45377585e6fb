"""Prompt chunks sized by time, so that no step runs much longer than `prefill_chunk_seconds`.

A step is the engine's unit of attention: a hang-up, an abort, a new request and every other
stream's next token wait for it to end. A fixed token budget cannot serve both a GPU that
prefills 2,048 tokens in 50 ms and a CPU that needs 0.1 s a token. So the pacer measures what a
step's tokens cost (prompt chunks and decode rows alike) and offers the next step the tokens
that fit the target: a power of two (few distinct attention shapes), at least `MIN_TOKENS`, or,
where the target fits more, the ceiling itself (one shape too).
While streams decode, `MixedStepCap` also keeps a step with prompt work within a few decode
steps' time (`prefill_itl_ratio`).
"""

from __future__ import annotations

import time

from mlx_paged.engine.mixed_step_cap import MixedStepCap

MIN_TOKENS = 4  # prompts always progress, whatever a token costs
SMOOTHING = 0.5  # weight of a dearer step in the seconds-per-token estimate


def _floor_pow2(n: float) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)


class StepPacer:
    """The token budget of the next step.

    Args:
        target_seconds: how long a step with prompt work may take; None turns pacing off.
        max_tokens: the budget's ceiling: the most tokens a step can run, its prompt chunks and
            decode rows together (the scheduler's own limits still apply).
        itl_ratio: while streams decode, how many decode-only steps' time a step with prompt
            work may take (`MixedStepCap`); None: only `target_seconds` applies.
    """

    def __init__(self, target_seconds: float | None, max_tokens: int,
                 itl_ratio: float | None = None):  # fmt: skip
        self.target_seconds = target_seconds
        self.max_tokens = max(max_tokens, MIN_TOKENS)
        self.seconds_per_token: float | None = None
        self.mixed_cap = MixedStepCap(itl_ratio) if itl_ratio and target_seconds else None

    @property
    def decoding_budget(self) -> int | None:
        """Prompt tokens the next step may run beside decode rows (None: only `budget`)."""
        return self.mixed_cap.budget if self.mixed_cap is not None else None

    @property
    def budget(self) -> int | None:
        """Tokens the next step may run (None: no pacing). Before any measurement, the
        floor: the first step of a slow device must not be the one that stalls."""
        if self.target_seconds is None:
            return None
        if self.seconds_per_token is None:
            return MIN_TOKENS
        fit = self.target_seconds / self.seconds_per_token
        if fit >= self.max_tokens:
            # Not rounded down: the rows that decode beside whole chunks must not cut the
            # chunks a few tokens short, which would leave each prompt a step of its own.
            return self.max_tokens
        return max(MIN_TOKENS, _floor_pow2(fit))

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

    def mark(self, metrics) -> tuple:
        """What `after_step` compares with: the engine's token counters, its counts of prompt
        work (mixed steps, prefill seconds), the time now and the budget the step runs under."""
        return (metrics.prompt_tokens_total, metrics.generation_tokens_total,
                _chunk_work(metrics), time.perf_counter(), self.budget)  # fmt: skip

    def after_step(self, metrics, mark: tuple) -> int | None:
        """Observe the step since `mark`; returns the next step's budget. A step with prompt
        work is observed if its tokens (prompt and decode rows) filled at least half its budget:
        a step of a few tokens (prompts' last tokens) costs mostly its fixed overhead and would
        undersize the next chunks. `mixed_cap` sees the steps with decode rows: as steps with
        prompt work where prompt chunks ran, else as decode steps (rows that start feed their
        last prompt token as a decode row does)."""
        prompt, generated, chunk_work, tic, budget = mark
        seconds = time.perf_counter() - tic
        num_prompt = metrics.prompt_tokens_total - prompt
        num_generated = metrics.generation_tokens_total - generated
        if self.mixed_cap is not None and num_generated > 0:
            if _chunk_work(metrics) != chunk_work:
                self.mixed_cap.observe_mixed(num_prompt, seconds)
            else:
                self.mixed_cap.observe_decode(seconds)
        num_tokens = num_prompt + num_generated
        if budget is not None and num_prompt > 0 and 2 * num_tokens >= budget:
            self.observe(num_tokens, seconds)
        return self.budget


def _chunk_work(metrics) -> tuple[int, float]:
    """Counters that move when prompt chunks run: in a decode forward, or in one of their own."""
    return metrics.mixed_steps_total, metrics.prefill_seconds_total
