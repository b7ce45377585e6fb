"""The engine's inbox: what other threads ask of it (adds, aborts) waits here and is applied
on the engine thread between steps, so the scheduler and caches are never touched concurrently."""

from __future__ import annotations

import contextlib
import logging
import queue

from mlx_paged.engine.outputs import CoreOutput
from mlx_paged.request import Request, RequestStatus

logger = logging.getLogger(__name__)

_ABORT_STATUS = {
    "abort": RequestStatus.FINISHED_ABORTED,
    "stop": RequestStatus.FINISHED_STOPPED,
    "error": RequestStatus.FINISHED_ERROR,
}


class EngineInbox:
    """Mixed into `Engine` (which provides `_inbox`, the scheduler, `_requests`, `_sink`,
    `_finish`, metrics, the sampling check and the runner's grammar matchers)."""

    def submit(self, request: Request) -> None:
        """Queue a request whose outputs go to the sink. Its grammar's matcher is made here,
        on the submitting thread, so no step waits on a grammar's compile."""
        with contextlib.suppress(Exception):  # made again, and refused, when added
            self._make_matcher(request)
        self._inbox.put(("add", request))

    def _make_matcher(self, request: Request) -> None:
        """Give a request with a grammar its matcher, waiting for `grammar_after` if any."""
        params, runtime = request.sampling_params, request.runtime
        if params.grammar is not None and runtime.matcher is None:
            runtime.matcher = self.runner.grammars.matcher(params.grammar)
            runtime.grammar_after = tuple(params.grammar_after)

    def abort(self, request_id: str, reason: str = "abort") -> None:
        """End a request: "abort" (cancelled; an abort output is sent), "stop" (a stop string
        matched in the front) or "error" (its text failed in the front)."""
        self._inbox.put(("abort", request_id, reason))

    def fail_queued_now(self, message: str) -> None:
        """Fail every request not yet admitted at once, from any thread, even while a long
        step runs (shutdown); needs a sink that other threads may call. The engine thread
        drops them from the scheduler between steps."""
        with self._inbox.mutex:  # requests sent during this step
            queued = [item[1] for item in self._inbox.queue if item[0] == "add"]
        queued += list(self.scheduler.waiting)  # one C call under the GIL: a consistent copy
        if not queued:
            return
        self._sink([CoreOutput(r.request_id, finish_reason="error", error=message) for r in queued])
        for req in queued:
            self.abort(req.request_id, "error")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _apply(self, item: tuple) -> None:
        if item[0] == "add":
            self._add(item[1])
        elif item[0] == "abort":
            req = self._requests.get(item[1])
            if req is not None:
                reason = item[2]
                self._finish([req], _ABORT_STATUS[reason])
                self.metrics.count_finish(reason)
                if reason == "abort":
                    self._sink([CoreOutput(req.request_id, finish_reason="abort")])

    def _add(self, request: Request) -> None:
        self.metrics.requests_total += 1
        try:
            self._check_sampling(request.sampling_params)
            self._make_matcher(request)
        except Exception as exc:  # its sampling would throw inside a shared step
            logger.warning("request %s refused: its sampling failed: %s", request.request_id, exc)
            self.metrics.count_finish("error")
            message = f"sampling failed for this request's parameters: {exc}"
            self._sink([CoreOutput(request.request_id, finish_reason="error", error=message)])
            return
        self._requests[request.request_id] = request
        self.scheduler.add_request(request)

    def drain_inbox(self) -> None:
        """Apply queued adds and aborts now (for callers that drive `step` themselves)."""
        self._drain_inbox(block=False)

    def _fail(self, req: Request, message: str) -> None:
        """End a request with an error its client reads."""
        self._finish([req], RequestStatus.FINISHED_ERROR)
        self.metrics.count_finish("error")
        self._sink([CoreOutput(req.request_id, finish_reason="error", error=message)])

    def _abort_all(self, message: str) -> None:
        for req in list(self._requests.values()):
            self._fail(req, message)
