"""The listening socket: one handler thread per admitted connection, refusals when full."""

from __future__ import annotations

import logging
import sys
from http.server import ThreadingHTTPServer

from mlx_paged.server.body_reader import keep_large_buffers_out_of_the_heap
from mlx_paged.server.connections import ConnectionGuard
from mlx_paged.server.error_shapes import error_body
from mlx_paged.server.http import GONE, APIHandler
from mlx_paged.server.state import ServerState

logger = logging.getLogger("mlx_paged.server")


class _Server(ThreadingHTTPServer):
    # The stdlib's listen backlog of 5 resets connections when many clients arrive at once.
    request_queue_size = 512
    daemon_threads = True
    state: ServerState

    def process_request(self, request, client_address):
        if not self.state.guard.admit(request):
            self._refuse(request)
            return
        super().process_request(request, client_address)

    def _refuse(self, request) -> None:
        body = error_body(
            503,
            f"the server has {self.state.max_connections} connections open, "
            f"all busy (--max-connections): retry later",
            code="server_busy",
        )
        try:
            request.settimeout(1.0)
            request.sendall(
                b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json"
                b"\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
        except OSError:
            pass
        self.shutdown_request(request)

    def shutdown_request(self, request):
        self.state.guard.release(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address):
        # A client that went away is routine; anything else is logged once, with its traceback.
        if isinstance(sys.exc_info()[1], GONE):
            logger.debug("client %s went away", client_address)
        else:
            logger.exception("error on the connection from %s", client_address)


def make_server(state: ServerState, host: str, port: int) -> ThreadingHTTPServer:
    """Bind the HTTP server (not started) with a handler class bound to `state`."""
    keep_large_buffers_out_of_the_heap()
    state.guard = state.guard or ConnectionGuard(state.max_connections, state.request_timeout)
    handler = type("BoundAPIHandler", (APIHandler,), {"state": state})
    server = _Server((host, port), handler)
    server.state = state
    return server
