"""Reading a request's JSON body within the server's bounds: its own size
(`--max-request-bytes`), its deadline, and the bytes all bodies in flight hold together
(`--max-pending-bytes`)."""

from __future__ import annotations

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.request_body import content_length, parse_json_body, read_exactly

MAX_DISCARD_BYTES = 64 * 1024 * 1024


class BodyReaderMixin:
    """For the HTTP handler, which provides `state`, `headers`, `rfile` and `connection`."""

    def read_json_body(self) -> dict:
        """The request's body as a JSON object.

        Raises:
            InvalidRequestError: 411/413/400/408 for the body itself, 503 when the bodies
                other requests are sending hold the pending-bytes budget.
        """
        n = self._body_length()
        pending = self.state.pending
        if not pending.try_reserve(n):
            self._refuse_body(
                InvalidRequestError(
                    f"other requests' bodies hold the server's {pending.limit} bytes for "
                    "bodies in flight (--max-pending-bytes): retry shortly",
                    status=503,
                    code="server_busy",
                )
            )
        try:
            try:
                raw = read_exactly(
                    self.rfile.read, n, lambda: self.state.guard.cut_reason(self.connection)
                )
            except InvalidRequestError:
                self.close_connection = True  # what is left of the body cannot be trusted
                raise
            return parse_json_body(raw)
        finally:
            pending.release(n)

    def _body_length(self) -> int:
        try:
            return content_length(self.headers, self.state.max_request_bytes)
        except InvalidRequestError as exc:
            if exc.status == 413:
                self._refuse_body(exc)
            self.close_connection = True
            raise

    def _refuse_body(self, exc: InvalidRequestError) -> None:
        """Drop the body of a request refused before reading it, then raise `exc`."""
        self.close_connection = True
        self._discard_body(self.headers.get("Content-Length", "0"))
        raise exc

    def _discard_body(self, length: str) -> None:
        """Read and drop a refused body (up to 64 MiB, within the request deadline), so the
        client, still sending, reads our refusal instead of a reset connection."""
        left = min(int(length), MAX_DISCARD_BYTES)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass
