"""The front's half of the engine: each open request's stream and text state. The engine core's
per-step outputs (token ids) come in; text increments go out to the streams."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mlx_paged.engine.output_processor import OutputProcessor
from mlx_paged.engine.outputs import CoreOutput, RequestOutput
from mlx_paged.engine.request_stream import RequestStream
from mlx_paged.request import Request
from mlx_paged.sampling.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class OutputRouter:
    """Routes core outputs to request streams.

    Args:
        tokenizer: the model's tokenizer, for detokenization.
        abort: `abort(request_id, reason)` on the engine core; called when a client cancels
            ("abort"), when a stop string ends a request here ("stop") and when its text
            failed ("error").
    """

    def __init__(self, tokenizer, abort: Callable[[str, str], None]):
        self.processor = OutputProcessor(tokenizer)
        self._abort = abort
        self._streams: dict[str, RequestStream] = {}

    @property
    def num_open(self) -> int:
        return len(self._streams)

    def open(
        self, request_id: str, params: SamplingParams, request: Request | None = None
    ) -> RequestStream:
        """Register a request before it is sent to the core, so none of its outputs is missed."""
        self.processor.add(request_id, params)
        stream = RequestStream(request_id, lambda: self._abort(request_id, "abort"), request)
        self._streams[request_id] = stream
        return stream

    def route(self, outputs: list[CoreOutput]) -> None:
        """Deliver one step's outputs; outputs of requests already closed here are dropped."""
        for core in outputs:
            stream = self._streams.get(core.request_id)
            if stream is None:  # ended here already: a stop string, a failure, a cancel
                continue
            if core.error is not None or core.finish_reason in ("abort", "error"):
                self._close(core.request_id)
                reason = core.finish_reason or "error"
                stream.put(RequestOutput(core.request_id, finish_reason=reason, error=core.error))
                continue
            try:
                out = self.processor.process(core)
            except Exception as exc:  # this request's text: it fails alone
                logger.exception("output processing failed for %s", core.request_id)
                self._close(core.request_id)
                self._abort(core.request_id, "error")
                stream.fail(f"output processing failed: {exc}")
                continue
            if out.finished:
                self._close(core.request_id)
                if core.finish_reason is None:  # a stop string: the core still runs it
                    self._abort(core.request_id, "stop")
            stream.put(out)

    def fail_all(self, message: str) -> None:
        """End every open stream with an error (shutdown, or the engine process gone)."""
        for request_id, stream in list(self._streams.items()):
            self._close(request_id)
            stream.fail(message)

    def _close(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self.processor.drop(request_id)
