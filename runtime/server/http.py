"""The HTTP front end: stdlib `ThreadingHTTPServer`, one thread per connection, feeding the
engine process through `EngineClient.add_request`.

Every reply is OpenAI-shaped JSON, the stdlib's own refusals (bad request lines, oversized
headers, unknown methods) included; an exception in a handler becomes a logged 500, never a
dropped connection.
"""

from __future__ import annotations

import hmac
import json
import logging
from http.server import BaseHTTPRequestHandler

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.body_reader import BodyReaderMixin, release_freed_memory
from mlx_paged.server.error_shapes import error_body
from mlx_paged.server.generation import GenerationMixin
from mlx_paged.server.header_budget import HeaderBudgetReader
from mlx_paged.server.state import ServerState

logger = logging.getLogger("mlx_paged.server")

GET_ROUTES = ("/health", "/metrics", "/v1/models")
POST_ROUTES = (
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/v1/messages",
    "/v1/messages/count_tokens",
)
GONE = (ConnectionError, TimeoutError)


class APIHandler(GenerationMixin, BodyReaderMixin, BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mlx-paged"
    state: ServerState  # set on the subclass that `make_server` builds

    # ---- plumbing -----------------------------------------------------------------------------

    def setup(self) -> None:
        self.timeout = self.state.request_timeout + 5  # a stalled write fails after this
        super().setup()
        self.rfile = HeaderBudgetReader(self.rfile)

    def parse_request(self) -> bool:
        self.rfile.start_headers()
        try:
            return super().parse_request()
        finally:
            self.rfile.end_headers()

    def handle_one_request(self) -> None:
        self.state.guard.waiting(self.connection)
        self._response_started = False
        super().handle_one_request()

    def log_message(self, fmt, *args):  # headers (and so any API key) are never logged
        logger.info("%s %s", self.address_string(), fmt % args)

    def log_error(self, fmt, *args):  # timeouts and refusals the stdlib reports
        logger.debug("%s %s", self.address_string(), fmt % args)

    def send_response(self, code: int, message: str | None = None) -> None:
        self._response_started = True
        super().send_response(code, message)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's refusals (400, 414, 431, 501, 505), in OpenAI's shape."""
        if code == 501 and self.command:
            message = f"method {self.command} is not supported"
        elif code == 431 and explain:  # which header bound: a line's, the count, or the sum
            message = explain
        if not self.request_version.startswith("HTTP/1."):
            self.request_version = "HTTP/1.1"  # a bad version: still answer with a status line
        self.close_connection = True
        self._send_error(code, message or self.responses.get(code, ("error",))[0])

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.state.allowed_origins)
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header(
            "Access-Control-Allow-Headers",
            "Content-Type, Authorization, x-api-key, anthropic-version, anthropic-beta",
        )

    def _send_bytes(self, status: int, body: bytes, content_type: str, headers=()) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self._cors()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, payload: dict) -> None:
        self._send_bytes(
            status, json.dumps(payload, ensure_ascii=False).encode(), "application/json"
        )

    def _send_error(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers=(),
    ) -> None:
        # A refused request line has no path: those answers take OpenAI's shape.
        anthropic = getattr(self, "path", "").startswith("/v1/messages")
        body = error_body(status, message, param, code, anthropic)
        self._send_bytes(status, body, "application/json", headers)

    def _authorized(self) -> bool:
        key = self.state.api_key
        if key is None:
            return True
        # Bearer tokens (OpenAI's clients) and x-api-key (Anthropic's) alike.
        authorization = self.headers.get_all("Authorization") or []
        x_api_key = self.headers.get_all("x-api-key") or []
        given = [v[7:] if v.startswith("Bearer ") else None for v in authorization] + x_api_key
        ok = (
            len(authorization) <= 1
            and len(x_api_key) <= 1
            and bool(given)
            and all(v is not None and hmac.compare_digest(v.encode(), key.encode()) for v in given)
        )
        if not ok:
            self._send_error(
                401,
                "missing or wrong API key: send one 'Authorization: Bearer <key>' or "
                "'x-api-key: <key>' header",
                code="invalid_api_key",
            )
        return ok

    def _dispatch(self, route) -> None:
        """Run a route; what it raises becomes a reply, and nothing drops the connection."""
        try:
            reason = self.state.guard.cut_reason(self.connection)
            if reason is not None:
                self.close_connection = True
                self._send_error(408, reason, code="request_timeout")
                return
            route()
        except InvalidRequestError as exc:
            self._reply_error(exc.status, exc.message, exc.param, exc.code)
        except GONE:
            self.close_connection = True
        except Exception as exc:
            logger.exception("unhandled error answering %s %s", self.command, self.path)
            self.close_connection = True
            self._reply_error(500, f"internal server error: {type(exc).__name__}")

    def _reply_error(self, status, message, param=None, code=None) -> None:
        if self._response_started:
            return  # a reply is under way: closing the connection is all that is left
        try:
            self._send_error(status, message, param, code)
        except GONE:
            pass

    # ---- routes -------------------------------------------------------------------------------

    def _route(self) -> str:
        return self.path.split("?", 1)[0].rstrip("/")

    def _method_not_allowed(self, path: str) -> bool:
        """Answer 404 or 405 unless `self.command` is served at `path`; True if answered."""
        gets = path in GET_ROUTES or path.startswith("/v1/models/")
        allowed = (
            ("GET", "HEAD", "OPTIONS")
            if gets
            else ("POST", "OPTIONS")
            if path in POST_ROUTES
            else ()
        )
        if not allowed:
            self._send_error(404, f"no route for {self.command} {path or '/'}")
            return True
        if self.command not in allowed:
            self._send_error(
                405,
                f"{self.command} is not allowed on {path}; use {allowed[0]}",
                headers=[("Allow", ", ".join(allowed))],
            )
            return True
        return False

    def do_OPTIONS(self):
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        self._dispatch(self._get)

    do_HEAD = do_GET

    def do_POST(self):
        self._dispatch(self._post)

    def do_PUT(self):
        self.close_connection = True  # its body, if any, is not read
        self._dispatch(lambda: self._method_not_allowed(self._route()))

    do_DELETE = do_PATCH = do_PUT

    def _get(self) -> None:
        self.state.guard.busy(self.connection)
        path = self._route()
        if self._method_not_allowed(path):
            return
        if path == "/health":
            healthy, why = self.state.engine.health()
            if self.state.shutting_down:
                healthy, why = False, "shutting down"
            self._send_json(200 if healthy else 503, {"status": why})
        elif path == "/metrics":
            if self._authorized():
                self._send_bytes(
                    200, self.state.engine.metrics_text().encode(), "text/plain; version=0.0.4"
                )
        elif path in ("/v1/models", f"/v1/models/{self.state.model_id}"):
            if self._authorized():
                card = {
                    "id": self.state.model_id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "mlx-paged",
                }
                self._send_json(
                    200, card if path != "/v1/models" else {"object": "list", "data": [card]}
                )
        elif self._authorized():
            self._send_error(
                404,
                f"model {path[len('/v1/models/') :]!r} is not served here; "
                f"this server serves {self.state.model_id!r}",
                "model",
                "model_not_found",
            )

    def _post(self) -> None:
        path = self._route()
        if self._method_not_allowed(path):
            self.close_connection = True
            return
        if not self._authorized():
            self.close_connection = True
            return
        with self.state.lock:
            self.state.active += 1
        try:
            # No reference kept here: the body is freed once its request is parsed.
            self.handle_generation(path, self.read_json_body())
        finally:
            release_freed_memory(self.headers.get("Content-Length"))
            with self.state.lock:
                self.state.active -= 1
