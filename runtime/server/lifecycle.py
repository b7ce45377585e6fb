"""Serve until SIGINT/SIGTERM, then shut down within a bounded time.

On the signal: stop accepting, fail the requests still queued (they would not finish), give the
running ones `--shutdown-grace` seconds, then end every open stream with an error event and
`[DONE]` without waiting for the engine thread, which may be inside a long step.
"""

from __future__ import annotations

import logging
import signal
import threading

from mlx_paged.server.state import ServerState, wait_for_idle

logger = logging.getLogger("mlx_paged")

SHUTDOWN_MESSAGE = "the server is shutting down"
# After the grace period: how long handlers get to write the final error events, and how long
# the engine thread gets to leave its step, before the process exits regardless.
FINAL_WRITE_SECONDS = 2.0
ENGINE_JOIN_SECONDS = 1.0


def serve_until_signal(server, state: ServerState, grace: float) -> None:
    """Run `server` on a thread until a signal arrives, then shut down as described above."""
    stopping = threading.Event()

    def stop(signum, _frame):
        if stopping.is_set():
            return
        stopping.set()
        state.shutting_down = True
        logger.info(
            "received %s: no new requests; finishing the ones in flight",
            signal.Signals(signum).name,
        )

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    # HTTP runs on its own thread; the main thread only waits, so signals are handled at once.
    http_thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.2},
        name="mlx-paged-http",
        daemon=True,
    )
    http_thread.start()
    while not stopping.wait(0.2):
        pass
    shut_down(server, state, grace)


def shut_down(server, state: ServerState, grace: float) -> None:
    """Stop accepting, drain within `grace` seconds, end what is left, stop the engine."""
    engine = state.engine
    server.shutdown()
    server.server_close()
    engine.abort_waiting(SHUTDOWN_MESSAGE)
    if not wait_for_idle(state, grace):
        logger.warning("ending the requests still running after %.1f s", grace)
        engine.fail_open_streams(SHUTDOWN_MESSAGE)
        wait_for_idle(state, FINAL_WRITE_SECONDS)
    engine.shutdown(timeout=ENGINE_JOIN_SECONDS)
    if state.guard is not None:
        state.guard.close()
    logger.info("stopped")
