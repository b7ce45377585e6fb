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
    (two engines in one process, say). The chain lives outside `mx.compile`: the launcher's
    compiled launch takes the counters as an input and returns `counters_next`, and a caller
    that traced a whole step around the launcher would leave a tracer here.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: mx.array | None = None

    def call(self, groups: int, launch: Callable[[mx.array], Sequence[mx.array]]):
        """Return `launch(counters)`, whose last output must be the kernel's `counters_next`
        (shaped like `counters`); `counters` holds zeros in at least `groups` slots."""
        with self._lock:
            latest = self._latest
            if latest is None or latest.size < groups:
                # Growing starts a new chain on a new buffer: the old calls keep theirs.
                size = max(groups, 2 * latest.size if latest is not None else _FIRST_SIZE)
                latest = mx.zeros((size,), dtype=mx.int32)
            outputs = launch(latest)
            self._latest = outputs[-1]
        return outputs

    def size(self) -> int:
        """Slots in the counters the next call gets (0 before the first call)."""
        return 0 if self._latest is None else self._latest.size
