"""Tell a client that hung up from one that only closed its sending side.

Both look the same on the read side (end-of-file), and HTTP allows a client to half-close
after its request. Only a write tells them apart: to a client that closed, it draws a reset.
So at end-of-file the watch writes something the client ignores (an SSE comment in a stream,
an interim `100 Continue` before a plain response to HTTP/1.1) and calls the client gone when
the write, or the next read, fails.
"""

from __future__ import annotations

import select
import selectors
import socket
from collections.abc import Callable

KEEPALIVE_COMMENT = b": keep-alive\n\n"
INTERIM_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def readable_now(sock: socket.socket) -> bool:
    """Whether a read on `sock` would not block (data, end-of-file or an error), at any
    descriptor number: `select.select` refuses descriptors past 1023."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(0))


class ClientWatch:
    """Polled while a request waits for the engine.

    Args:
        sock: the connection.
        write_probe: writes the bytes the client ignores (raises OSError if it is gone); None
            when nothing may be written (an HTTP/1.0 client), and end-of-file then means gone.
        max_probes: interim responses to send before taking end-of-file for a half-close
            (each costs the client nothing, but there is no reason to send many).
    """

    def __init__(
        self,
        sock: socket.socket,
        write_probe: Callable[[], None] | None,
        max_probes: int | None = None,
    ):
        self.sock = sock
        self.write_probe = write_probe
        self.max_probes = max_probes
        self.probes = 0

    def gone(self) -> bool:
        """True once the client is known to have hung up."""
        try:
            if not readable_now(self.sock) or self.sock.recv(1, socket.MSG_PEEK) != b"":
                return False  # nothing new, or pipelined bytes: still there
        except OSError:
            return True  # a reset arrived
        if self.write_probe is None:
            return True
        if self.max_probes is not None and self.probes >= self.max_probes:
            return False  # half-closed: the final write will tell
        try:
            self.write_probe()
        except OSError:
            return True
        self.probes += 1
        return False
