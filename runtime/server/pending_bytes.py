"""A bound on the request bodies the server holds at once while it reads and parses them
(`--max-pending-bytes`): with `--max-request-bytes` alone, every connection could hold a full
body at the same time."""

from __future__ import annotations

import threading


class PendingBytes:
    """Bytes reserved by bodies being read; thread-safe.

    Args:
        limit: most bytes reserved at once (at least the largest body allowed).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def try_reserve(self, n: int) -> bool:
        """Reserve `n` bytes; False (nothing reserved) when they do not fit now."""
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.used -= n
