"""Progress of long work (model conversion, warm-ups, benchmarks): a tqdm bar on a terminal,
and log lines with the count, the time spent and an estimate of the time left elsewhere (a log
file, CI), so no long step is silent."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
LOG_EVERY_SECONDS = 10.0  # how often log lines report, away from a terminal
MIN_ESTIMATE_FRACTION = 0.05  # the share done before log lines estimate the time left

logger = logging.getLogger("mlx_paged.progress")


def on_terminal() -> bool:
    """Whether stderr is a terminal, where a bar can redraw itself."""
    return sys.stderr.isatty()


class Progress:
    """How far along one piece of work is; `update(n)` as it advances, `close()` at the end
    (or use it as a context manager).

    Args:
        desc: what is being done, e.g. "warming prefill shapes".
        total: how many units in all (None: unknown, no estimate).
        unit: what one unit is, for the bar and the log lines.
        log: the logger for the log lines (default `mlx_paged.progress`).
    """

    def __init__(
        self,
        desc: str,
        total: int | None = None,
        unit: str = "it",
        log: logging.Logger | None = None,
    ):
        self.desc, self.total, self.unit = desc, total, unit
        self.log = log or logger
        self.done = 0
        self._reported: int | None = None  # the count the last log line showed
        self._start = self._last = time.perf_counter()
        self._bar = None
        if on_terminal():
            self._bar = tqdm(desc=desc, total=total, unit=unit, dynamic_ncols=True)
        else:
            self.log.info("%s: 0%s %s", desc, self._of(), unit)

    def _of(self) -> str:
        return f"/{self.total}" if self.total else ""

    def update(self, n: int = 1) -> None:
        """Advance by `n` units."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.perf_counter()
        if now - self._last >= LOG_EVERY_SECONDS:
            self._last = now
            self._line(now)

    def close(self) -> None:
        """End the bar, or log the last line with the time it took."""
        if self._bar is not None:
            self._bar.close()
        elif self._reported != self.done:
            self._line(time.perf_counter())

    def _line(self, now: float) -> None:
        self._reported = self.done
        elapsed = now - self._start
        timing = f"{elapsed:.1f} s"
        # An estimate from the first few percent (a prefill before decoding) misleads.
        if self.total and self.total * MIN_ESTIMATE_FRACTION <= self.done < self.total:
            timing += f", about {elapsed / self.done * (self.total - self.done):.0f} s left"
        self.log.info("%s: %d%s %s, %s", self.desc, self.done, self._of(), self.unit, timing)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(
    items: Iterable[T],
    desc: str,
    *,
    total: int | None = None,
    unit: str = "it",
    log: logging.Logger | None = None,
) -> Iterator[T]:
    """Yield `items` while showing a `Progress` of them (`total` defaults to `len(items)`)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)
    with Progress(desc, total, unit, log) as bar:
        for item in items:
            yield item
            bar.update()
