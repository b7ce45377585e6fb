"""One JSON line a step (`--step-log`): what each engine step ran and where its time went, for
finding the steps behind long inter-token gaps.

A line: `time` (Unix seconds at the step's start), `seconds` (its wall time), `prompt_tokens`
and `generated_tokens` it ran, `mixed` (prompt chunks rode in its decode forward),
`prefill_seconds` (prompt work in forwards of its own), the decode forward's `build_seconds`,
`dispatch_seconds` and `device_wait_seconds`, and `failed` (the step raised and was recovered).
Steps that ran no token are not written.
"""

from __future__ import annotations

import json
import time

# (line key, where the engine counts it) for each counter a line reports as this step's share.
COUNTERS = (
    ("prompt_tokens", "metrics", "prompt_tokens_total"),
    ("generated_tokens", "metrics", "generation_tokens_total"),
    ("mixed", "metrics", "mixed_steps_total"),
    ("prefill_seconds", "metrics", "prefill_seconds_total"),
    ("build_seconds", "runner", "build_seconds"),
    ("dispatch_seconds", "runner", "dispatch_seconds"),
    ("device_wait_seconds", "runner", "device_wait_seconds"),
)


class StepLog:
    """Appends a line per step to `path` (line-buffered, so a crash loses no finished step);
    with no path, writes nothing."""

    def __init__(self, path: str | None):
        self._file = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def mark(self, engine) -> tuple | None:
        """The engine's counters and the clocks before a step (None when off)."""
        if self._file is None:
            return None
        return _counters(engine), time.time(), time.perf_counter()

    def record(self, engine, mark: tuple | None, failed: bool = False) -> None:
        """Write the step since `mark`, if it ran any token or failed."""
        if mark is None:
            return
        before, start, tic = mark
        seconds = time.perf_counter() - tic
        moved = [now - then for now, then in zip(_counters(engine), before)]
        line = {name: value for (name, *_), value in zip(COUNTERS, moved)}
        if not (line["prompt_tokens"] or line["generated_tokens"] or failed):
            return
        line["mixed"] = bool(line["mixed"])
        self._file.write(json.dumps({"time": start, "seconds": seconds, **line,
                                     "failed": failed}) + "\n")  # fmt: skip


def _counters(engine) -> list:
    return [getattr(getattr(engine, owner), name) for _, owner, name in COUNTERS]
