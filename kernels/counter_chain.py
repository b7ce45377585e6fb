"""The fused split-K kernel's partition counters, handed from each call to the next.

A fused call counts its finished partitions on one int32 counter per (sequence, KV head), and
the counters must start at zero. A fresh `mx.zeros` per call costs a fill kernel: on the H200
that node took 10-11 µs of GPU time per call, more than the whole kernel at small shapes. So
each call writes zeros into an extra output, `counters_next`, and the next call counts on it.
The data dependency also orders the calls in MLX's graph, so no two calls running at once ever
share counters (independent calls would otherwise run concurrently in MLX's CUDA graphs).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import mlx.core as mx

_FIRST_SIZE = 256


class CounterChain:
    """The counters the next fused call takes; each call's `counters_next` replaces them.

    One chain orders every fused call that goes through it, including calls that share no data
    (two engines in one process, say). A caller that traces a whole step with `mx.compile`
    passes the counters in and out of the trace: it seeds a chain inside with `replace` (the
    outer chain's `reserve`), and hands the trace's last `counters_next` back to the outer chain.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: mx.array | None = None

    def call(self, groups: int, launch: Callable[[mx.array], Sequence[mx.array]]):
        """Return `launch(counters)`, whose last output must be the kernel's `counters_next`
        (shaped like `counters`); `counters` holds zeros in at least `groups` slots."""
        with self._lock:
            outputs = launch(self._grown(groups))
            self._latest = outputs[-1]
        return outputs

    def reserve(self, groups: int) -> mx.array:
        """The counters the next call would take, grown to at least `groups` slots."""
        with self._lock:
            self._latest = self._grown(groups)
            return self._latest

    def replace(self, counters: mx.array) -> None:
        """Make `counters` the ones the next call takes."""
        with self._lock:
            self._latest = counters

    def _grown(self, groups: int) -> mx.array:
        latest = self._latest
        if latest is None or latest.size < groups:
            # Growing starts a new chain on a new buffer: the old calls keep theirs.
            size = max(groups, 2 * latest.size if latest is not None else _FIRST_SIZE)
            latest = mx.zeros((size,), dtype=mx.int32)
        return latest

    def size(self) -> int:
        """Slots in the counters the next call gets (0 before the first call)."""
        return 0 if self._latest is None else self._latest.size
