"""Reading a request's JSON body within the server's bounds: its own size
(`--max-request-bytes`), its deadline, and the bytes all bodies in flight hold together
(`--max-pending-bytes`)."""

from __future__ import annotations

import ctypes
import threading

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.request_body import content_length, parse_json_body, read_exactly

MAX_DISCARD_BYTES = 64 * 1024 * 1024
LARGE_BODY_BYTES = 1 << 20  # past this, the memory its parse used is handed back to the system


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter


def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: its allocator returns memory itself
        return None


_LIBC = _glibc()
_TRIM = getattr(_LIBC, "malloc_trim", None)


def keep_large_buffers_out_of_the_heap() -> None:
    """Have glibc map buffers of 1 MiB and more on their own and unmap them when freed. By
    default it raises that threshold to the largest buffer freed so far (up to 32 MiB), after
    which request bodies land in the threads' heaps and stay there."""
    if _LIBC is not None and hasattr(_LIBC, "mallopt"):
        _LIBC.mallopt(M_MMAP_THRESHOLD, LARGE_BODY_BYTES)


_LARGE_PARSE = threading.Lock()


def release_freed_memory(content_length: str | None) -> None:
    """After a large body: hand the memory its parse freed back to the system. glibc keeps
    freed heap in each thread's arena, so handler threads would each hold what their
    largest body needed."""
    if _TRIM is None or content_length is None or not content_length.strip().isdigit():
        return
    if int(content_length) >= LARGE_BODY_BYTES:
        _TRIM(0)


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
            if n < LARGE_BODY_BYTES:
                return parse_json_body(raw)
            with _LARGE_PARSE:  # its objects can take ten times its bytes: one at a time
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
