"""The front process's handle on the engine process: the same calls the HTTP server makes on
an in-process engine, over a pipe. It detokenizes the engine's token ids here, and when the
engine process dies it fails the requests in flight at once and starts a new one."""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import threading
import time

from mlx_paged.engine.core_process import EngineProcessSpec, run_engine_process
from mlx_paged.engine.output_router import OutputRouter
from mlx_paged.engine.request_checks import RequestLimits
from mlx_paged.engine.request_stream import RequestStream
from mlx_paged.errors import InvalidRequestError
from mlx_paged.request import next_request_id
from mlx_paged.sampling.sampling_params import SamplingParams

logger = logging.getLogger("mlx_paged.engine")

QUERY_SECONDS = 2.0  # how long /health and /metrics wait for the engine process to answer
MAX_RESTART_ATTEMPTS = 5


class EngineStartError(RuntimeError):
    """The engine process could not load the model; `exit_code` is what `serve` returns."""

    def __init__(self, exit_code: int, message: str):
        super().__init__(message)
        self.exit_code = exit_code


class EngineClient:
    """Runs the engine core in its own process.

    Args:
        spec: what the engine process loads and how it is configured.
        tokenizer: the model's tokenizer, loaded in this process for text.
    """

    def __init__(self, spec: EngineProcessSpec, tokenizer):
        self.spec = spec
        self.config = spec.config
        self.tokenizer = tokenizer
        self.router = OutputRouter(tokenizer, self.abort)
        self.limits: RequestLimits | None = None
        self.num_restarts = 0
        self.pid: int | None = None
        self._why_down = "the engine process is starting"
        self._lock = threading.Lock()  # sends, and the serving / not-serving switch
        self._serving = False
        self._stopping = False
        self._conn = None
        self._process = None
        self._queries: dict[int, list] = {}
        self._query_ids = itertools.count()

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine process and wait until its model is loaded.

        Raises:
            EngineStartError: the model could not be loaded or served.
        """
        context = multiprocessing.get_context("spawn")  # MLX state must not be forked
        ours, theirs = context.Pipe()
        process = context.Process(
            target=run_engine_process, args=(theirs, self.spec), name="mlx-paged-engine"
        )
        process.start()
        theirs.close()  # so a dead engine process reads as end-of-file here
        try:
            message = ours.recv()
        except (EOFError, OSError):
            process.join(5)
            raise EngineStartError(
                1, f"the engine process exited while loading (exit code {process.exitcode})"
            ) from None
        if message[0] == "failed":
            process.join(5)
            raise EngineStartError(message[1], message[2])
        with self._lock:
            self.limits, self._conn, self._process = message[1], ours, process
            self.pid, self._serving = process.pid, True
        logger.info("engine process %d serves", process.pid)
        threading.Thread(
            target=self._read, args=(ours, process), name="mlx-paged-engine-reader", daemon=True
        ).start()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the engine process: it fails what it still runs; killed after `timeout`."""
        self._stopping = True
        self._send(("shutdown",))
        process = self._process
        if process is not None:
            process.join(timeout)
            if process.is_alive():
                process.kill()
                process.join(5)

    @property
    def is_alive(self) -> bool:
        return self._serving

    def health(self) -> tuple[bool, str]:
        """(healthy, why), from the engine process when it serves."""
        if not self._serving:
            return False, self._why_down
        answer = self._query("health")
        if answer is None:
            return False, "the engine process does not answer"
        return answer

    def metrics_text(self) -> str:
        """Prometheus text: the engine process's metrics, and this process's own."""
        lines = [
            "# HELP mlx_paged_engine_up Whether the engine process serves.",
            "# TYPE mlx_paged_engine_up gauge",
            f"mlx_paged_engine_up {int(self._serving)}",
            "# HELP mlx_paged_engine_restarts_total Engine processes started after one died.",
            "# TYPE mlx_paged_engine_restarts_total counter",
            f"mlx_paged_engine_restarts_total {self.num_restarts}",
        ]
        engine_text = self._query("metrics") if self._serving else None
        return (engine_text or "") + "\n".join(lines) + "\n"

    # ---- requests -------------------------------------------------------------------------

    def check_request(
        self, prompt_token_ids: list[int], params: SamplingParams, max_tokens_explicit: bool = True
    ) -> SamplingParams:
        """Validate a request against the model's limits (see `RequestLimits.fit`)."""
        return self.limits.fit(prompt_token_ids, params, max_tokens_explicit)

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Send a request to the engine process; the stream yields its text increments.

        Raises:
            InvalidRequestError: 503 while no engine process serves.
        """
        request_id = next_request_id()
        with self._lock:  # against the engine's death: either it is failed there, or refused
            if not self._serving:
                raise InvalidRequestError(self._why_down, status=503)
            stream = self.router.open(request_id, params)
            self._send_locked(("add", request_id, list(prompt_token_ids), params))
        return stream

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._send(("abort", request_id, reason))

    def abort_waiting(self, message: str) -> None:
        """Fail every request not yet admitted (shutdown: they would not finish in time)."""
        self._send(("abort_waiting", message))

    def fail_open_streams(self, message: str) -> None:
        """End every open stream with an error now, whatever the engine process is doing."""
        self.router.fail_all(message)

    # ---- the pipe -------------------------------------------------------------------------

    def _send(self, message: tuple) -> None:
        with self._lock:
            self._send_locked(message)

    def _send_locked(self, message: tuple) -> None:
        if self._conn is None:
            return
        try:
            self._conn.send(message)
        except OSError:  # it died: the reader fails what was in flight and restarts it
            pass

    def _query(self, what: str):
        query_id = next(self._query_ids)
        slot = self._queries[query_id] = [threading.Event(), None]
        self._send(("query", query_id, what))
        answered = slot[0].wait(QUERY_SECONDS)
        self._queries.pop(query_id, None)
        return slot[1] if answered else None

    def _read(self, conn, process) -> None:
        """Route the engine's messages until its process ends, then recover."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "outputs":
                self.router.route(message[1])
            elif message[0] == "answer":
                slot = self._queries.get(message[1])
                if slot is not None:
                    slot[1] = message[2]
                    slot[0].set()
        self._engine_died(process)

    def _engine_died(self, process) -> None:
        process.join(1)
        with self._lock:
            self._serving, self._conn = False, None
            if self._stopping:
                return
            self._why_down = (
                f"the engine process died (exit code {process.exitcode}); a new one is starting"
            )
            logger.error("%s", self._why_down)
            self.router.fail_all(
                f"the engine process died (exit code {process.exitcode}); "
                "this request was lost: send it again"
            )
        self._restart()

    def _restart(self) -> None:
        for attempt in range(MAX_RESTART_ATTEMPTS):
            if self._stopping:
                return
            try:
                self.start()
            except EngineStartError as exc:
                logger.error("restarting the engine process failed: %s", exc)
                time.sleep(min(2**attempt, 10))
                continue
            self.num_restarts += 1
            return
        self._why_down = "the engine process died and could not be restarted (see the log)"
        logger.error("%s", self._why_down)
