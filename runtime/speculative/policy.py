"""When to speculate: a speculative step gives up the lookahead's overlap of building the next
step with the device, which drafts must win back in accepted tokens. The policy measures both
kinds of decode steps as emitted tokens per row per second of step period (start to the next
step's start), keeps each rate as a moving average, runs the faster kind, and tries the other
one step in `probe_every`, so it follows the batch and the text as they change."""

from __future__ import annotations

import time
from dataclasses import dataclass

# Weight of the newest step in each moving average.
_EMA = 0.2
# A longer period had other work in it (a long prefill, an idle engine): not a step's rate.
_LONGEST_PERIOD_S = 0.5


@dataclass(slots=True)
class _Step:
    speculative: bool
    start: float
    rows: int
    tokens: int = 0


class SpeculationPolicy:
    """Chooses each decode step's kind and learns from its outcome.

    Args:
        adaptive: False speculates on every step it may (for tests and measurements).
        probe_every: steps of the faster kind between two trials of the other.
        max_rows: batches wider than this never speculate: drafts' extra query rows would
            take device time that so many rows already fill.
    """

    def __init__(self, adaptive: bool = True, probe_every: int = 16, max_rows: int = 64):
        self.adaptive = adaptive
        self.probe_every = probe_every
        self.max_rows = max_rows
        self.rates: dict[bool, float | None] = {True: None, False: None}
        self._since_probe = 0
        self._step: _Step | None = None

    def choose(self, num_rows: int) -> bool:
        """Whether a step of `num_rows` rows that may speculate does."""
        self._close()
        if num_rows > self.max_rows:
            return False
        if not self.adaptive:
            return True
        for kind in (True, False):  # each kind is measured before any comparison
            if self.rates[kind] is None:
                return kind
        best = self.rates[True] >= self.rates[False]
        self._since_probe += 1
        if self._since_probe >= self.probe_every:
            self._since_probe = 0
            return not best
        return best

    def begin(self, speculative: bool, num_rows: int) -> None:
        """A decode step of this kind starts (the previous one's period ends here)."""
        self._close()
        self._step = _Step(speculative, time.perf_counter(), num_rows)

    def _close(self) -> None:
        """End the current step's period now and learn its rate."""
        last, self._step = self._step, None
        if last is None or not last.rows:
            return
        period = time.perf_counter() - last.start
        if 0 < period <= _LONGEST_PERIOD_S:
            self._update(last.speculative, last.tokens / last.rows / period)

    def emitted(self, tokens: int) -> None:
        """The tokens the current step emitted."""
        if self._step is not None:
            self._step.tokens += tokens

    def _update(self, speculative: bool, rate: float) -> None:
        old = self.rates[speculative]
        self.rates[speculative] = rate if old is None else (1 - _EMA) * old + _EMA * rate
