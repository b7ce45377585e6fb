"""What the HTTP handler threads share, and waiting for them to go idle."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from mlx_paged.engine.core_client import EngineClient
from mlx_paged.server.api_fields import UnknownFieldLog
from mlx_paged.server.connections import ConnectionGuard
from mlx_paged.server.pending_bytes import PendingBytes


@dataclass
class ServerState:
    """What every handler thread shares."""

    engine: EngineClient
    model_id: str
    model_aliases: set[str]
    defaults: dict
    api_key: str | None = None
    max_request_bytes: int = 4 * 1024 * 1024
    allowed_origins: str = "*"
    request_timeout: float = 30.0
    max_connections: int = 512
    active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    shutting_down: bool = False
    guard: ConnectionGuard | None = None
    unknown_fields: UnknownFieldLog = field(default_factory=UnknownFieldLog)
    max_pending_bytes: int = 64 * 1024 * 1024
    pending: PendingBytes | None = None

    def __post_init__(self) -> None:
        self.pending = self.pending or PendingBytes(self.max_pending_bytes)


def wait_for_idle(state: ServerState, timeout: float) -> bool:
    """Wait until no request is in flight; False if `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with state.lock:
            if state.active == 0:
                return True
        time.sleep(0.05)
    return False
