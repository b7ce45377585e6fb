"""A bound on a request's header bytes in all. The standard library bounds each header line
(64 KiB) and their count (100), not their sum: a client could make the server hold 6 MB of
unfinished headers per connection. This reader counts the header lines of each request and
refuses past the budget, which the handler answers with 431."""

from __future__ import annotations

import http.client

MAX_HEADER_BYTES = 64 * 1024  # every header line of one request together


class HeadersTooLarge(http.client.HTTPException):
    """The request's headers passed the budget (the stdlib's parser answers it with 431)."""


class HeaderBudgetReader:
    """Wraps a connection's buffered reader; counts `readline` bytes between `start_headers`
    and `end_headers`. Everything else passes through."""

    def __init__(self, raw, limit: int = MAX_HEADER_BYTES):
        self.raw = raw
        self.limit = limit
        self.counting = False
        self.used = 0

    def start_headers(self) -> None:
        self.counting, self.used = True, 0

    def end_headers(self) -> None:
        self.counting = False

    def readline(self, size: int = -1) -> bytes:
        if not self.counting:
            return self.raw.readline(size)
        left = self.limit - self.used
        # Never read past the budget: a line that would pass it is cut and refused.
        line = self.raw.readline(left + 1 if size < 0 else min(size, left + 1))
        self.used += len(line)
        if self.used > self.limit:
            raise HeadersTooLarge(
                f"the request's headers pass {self.limit} bytes in all; send fewer or "
                "shorter headers"
            )
        return line

    def __getattr__(self, name):
        return getattr(self.raw, name)
