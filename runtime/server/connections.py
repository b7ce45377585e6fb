"""Bound what clients can hold: a cap on open connections and a deadline for receiving each
request.

A connection is either waiting for (or reading) a request, with a deadline, or busy (its request
is being answered, no deadline). A reaper thread shuts the read side of connections past their
deadline, so a slow or silent client cannot hold a thread. At the cap, a new connection takes the
place of the longest-waiting one; only when every connection is busy is it refused.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

logger = logging.getLogger("mlx_paged.server")


class ConnectionGuard:
    """Tracks open connections (thread-safe).

    Args:
        max_connections: most connections open at once (`--max-connections`).
        request_timeout: seconds a client has to send a whole request, counted from the
            connection or the end of the previous response (`--request-timeout`).
    """

    def __init__(self, max_connections: int, request_timeout: float):
        self.max_connections = max_connections
        self.request_timeout = request_timeout
        self._lock = threading.Lock()
        self._deadlines: dict[socket.socket, float | None] = {}  # None: busy
        self._timed_out: set[socket.socket] = set()
        self._evicted: set[socket.socket] = set()  # cut to make room for a new connection
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="mlx-paged-reaper", daemon=True)
        self._reaper.start()

    @property
    def num_open(self) -> int:
        return len(self._deadlines)

    def admit(self, sock: socket.socket) -> bool:
        """Register a new connection; False when every slot is busy."""
        with self._lock:
            if len(self._deadlines) >= self.max_connections:
                waiting = [(d, s) for s, d in self._deadlines.items() if d is not None]
                if not waiting:
                    return False
                _, oldest = min(waiting, key=lambda item: item[0])
                self._evicted.add(oldest)  # before its reader wakes up to the end-of-file
                del self._deadlines[oldest]
                self._close_read_side(oldest)
            self._deadlines[sock] = time.monotonic() + self.request_timeout
        return True

    def waiting(self, sock: socket.socket) -> None:
        """The connection waits for its next request: its deadline starts now."""
        with self._lock:
            if sock in self._deadlines:
                self._deadlines[sock] = time.monotonic() + self.request_timeout

    def busy(self, sock: socket.socket) -> None:
        """The request is in; answering it has no deadline."""
        with self._lock:
            if sock in self._deadlines:
                self._deadlines[sock] = None

    def timed_out(self, sock: socket.socket) -> bool:
        """Whether the reaper cut this connection's request."""
        return sock in self._timed_out

    def cut_reason(self, sock: socket.socket) -> str | None:
        """Why the server cut this connection's request while it arrived, if it did: past
        its deadline, or evicted at the connection cap."""
        if sock in self._timed_out:
            return "the request did not arrive within --request-timeout"
        if sock in self._evicted:
            return (
                "the request did not arrive before the connection was closed to make room for "
                "a new one (--max-connections)"
            )
        return None

    def release(self, sock: socket.socket) -> None:
        with self._lock:
            self._deadlines.pop(sock, None)
            self._timed_out.discard(sock)
            self._evicted.discard(sock)

    def close(self) -> None:
        self._stop.set()

    def _reap(self) -> None:
        while not self._stop.wait(0.25):
            now = time.monotonic()
            with self._lock:
                late = [s for s, d in self._deadlines.items() if d is not None and d < now]
                for sock in late:
                    self._deadlines[sock] = None
                    self._timed_out.add(sock)
                    self._close_read_side(sock)

    @staticmethod
    def _close_read_side(sock: socket.socket) -> None:
        # Reads then see end-of-file; the handler can still answer 408 on the write side.
        try:
            sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass
