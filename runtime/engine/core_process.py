"""The engine process: owns MLX, the scheduler and the KV pool, and talks to the front process
over one pipe.

Front to engine: ("add", request_id, prompt_token_ids, params), ("abort", request_id, reason),
("abort_waiting", message), ("query", query_id, "health" | "metrics"), ("shutdown",).
Engine to front: ("ready", RequestLimits) or ("failed", exit_code, message) once, after the
model loaded; then ("outputs", [CoreOutput, ...]) once per step and ("answer", query_id, value).
"""

from __future__ import annotations

import logging
import signal
import threading
from dataclasses import dataclass

from mlx_paged.engine.config import EngineConfig
from mlx_paged.process import LOG_FORMAT, exit_now, freeze_startup_objects

logger = logging.getLogger("mlx_paged.engine")


@dataclass(frozen=True)
class EngineProcessSpec:
    """What the engine process is started with (pickled to it)."""

    model_path: str
    chat_template: str | None
    config: EngineConfig
    log_level: str = "INFO"


class PipeSender:
    """`send` from several threads over one connection; a front that is gone stops the engine."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()
        self.on_broken = lambda: None

    def __call__(self, message: tuple) -> None:
        try:
            with self.lock:
                self.conn.send(message)
        except OSError:  # the front process is gone: nobody to serve
            self.on_broken()


def run_engine_process(conn, spec: EngineProcessSpec) -> None:
    """The engine process's main: load, say ready, run the step loop until told to stop."""
    # Ctrl-C reaches the whole process group; the front decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=spec.log_level, format=LOG_FORMAT)
    send = PipeSender(conn)
    engine = _load_engine(spec, send)
    send.on_broken = lambda: engine.shutdown(timeout=0)
    engine.warm_up()  # on this thread, which runs the step loop
    freeze_startup_objects()
    send(("ready", engine.limits))
    threading.Thread(
        target=_receive, args=(conn, engine, send), name="mlx-paged-engine-inbox", daemon=True
    ).start()
    engine.run_loop()
    exit_now(0)


def _load_engine(spec: EngineProcessSpec, send: PipeSender):
    from mlx_paged.engine.core import Engine
    from mlx_paged.models.loader import load_model

    try:
        model, tokenizer, _, model_config = load_model(spec.model_path, spec.chat_template)
    except (RuntimeError, ValueError, OSError) as exc:
        send(("failed", 1, f"could not load the model: {exc}"))
        exit_now(1)
    try:
        return Engine(
            model, tokenizer, spec.config, model_config, sink=lambda outs: send(("outputs", outs))
        )
    except ValueError as exc:  # a model the paged path cannot serve, or a pool too small
        send(("failed", 2, str(exc)))
        exit_now(2)


def _receive(conn, engine, send: PipeSender) -> None:
    """Move the front's messages into the engine's inbox; answer queries at once, from live
    state, even while a step runs."""
    from mlx_paged.engine.metrics import render_prometheus
    from mlx_paged.request import Request

    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the front process is gone
            message = ("shutdown",)
        kind = message[0]
        if kind == "add":
            _, request_id, prompt_token_ids, params = message
            engine.submit(Request(prompt_token_ids, params, request_id=request_id))
        elif kind == "abort":
            engine.abort(message[1], message[2])
        elif kind == "abort_waiting":  # answered now, not after the step in progress
            engine.fail_queued_now(message[1])
        elif kind == "query":
            what = message[2]
            value = engine.health() if what == "health" else render_prometheus(engine)
            send(("answer", message[1], value))
        elif kind == "shutdown":
            engine.shutdown(timeout=0)
            return
