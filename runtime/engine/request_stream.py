"""The consumer's handle on one request: the queue its output increments arrive on."""

from __future__ import annotations

import queue
from typing import TYPE_CHECKING

from mlx_paged.engine.outputs import RequestOutput
from mlx_paged.engine.request import Request

if TYPE_CHECKING:
    from mlx_paged.engine.core import Engine


class RequestStream:
    """Iterate (or `get`) to receive `RequestOutput` increments; the last one is `finished`."""

    def __init__(self, engine: Engine, request: Request):
        self.engine = engine
        self.request = request
        self.queue: queue.Queue[RequestOutput] = queue.Queue()

    @property
    def request_id(self) -> str:
        return self.request.request_id

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
        self.engine.abort(self.request_id)

    def fail(self, message: str) -> None:
        """End the stream with an error from outside the engine thread (shutdown while a step
        runs); anything the engine sends after this is never read."""
        self.queue.put(RequestOutput(self.request_id, finish_reason="error", error=message))
