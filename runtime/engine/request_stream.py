"""The consumer's handle on one request: the queue its output increments arrive on."""

from __future__ import annotations

import queue
from collections.abc import Callable

from mlx_paged.engine.outputs import RequestOutput
from mlx_paged.request import Request


class RequestStream:
    """Iterate (or `get`) to receive `RequestOutput` increments; the last one is `finished`.

    `request` is the engine's own `Request` when the engine runs in this process (offline use
    and tests look at it), None when it runs in the engine process.
    """

    def __init__(self, request_id: str, cancel: Callable[[], None], request: Request | None = None):
        self.request_id = request_id
        self.request = request
        self._cancel = cancel
        self.queue: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        # Called (on the producing thread) after each output is queued: how an asyncio
        # consumer learns of it without a thread of its own.
        self.on_output: Callable[[], None] | None = None

    def put(self, out: RequestOutput) -> None:
        """Queue an output for the consumer and tell it."""
        self.queue.put(out)
        if self.on_output is not None:
            self.on_output()

    def get(self, timeout: float | None = None) -> RequestOutput:
        return self.queue.get(timeout=timeout)

    def __iter__(self):
        while True:
            out = self.queue.get()
            yield out
            if out.finished:
                return

    def cancel(self) -> None:
        """Stop generating and free the request's cache (used when a client goes away)."""
        self._cancel()

    def fail(self, message: str) -> None:
        """End the stream with an error from outside the engine (shutdown while a step runs,
        the engine process gone); anything the engine sends after this is never read."""
        self.put(RequestOutput(self.request_id, finish_reason="error", error=message))
