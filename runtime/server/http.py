"""The HTTP front end: stdlib `ThreadingHTTPServer`, one thread per connection, feeding the
engine thread through `Engine.add_request`."""

from __future__ import annotations

import hmac
import json
import logging
import queue
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from ..engine import Engine
from ..errors import InvalidRequestError
from ..metrics import render_prometheus
from .protocol import ParsedRequest, parse_chat, parse_completion, parse_json_body
from .responses import SSE_DONE, ResponseBuilder, sse_event, usage
from .tool_calls import ToolCallExtractor

logger = logging.getLogger("mlx_paged.server")

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                404: "not_found_error", 411: "invalid_request_error",
                413: "invalid_request_error", 503: "service_unavailable", 500: "server_error"}


@dataclass
class ServerState:
    """What every handler thread shares."""

    engine: Engine
    model_id: str
    model_aliases: set[str]
    defaults: dict
    api_key: Optional[str] = None
    max_request_bytes: int = 4 * 1024 * 1024
    allowed_origins: str = "*"
    active: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    shutting_down: bool = False


class APIHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mlx-paged"
    state: ServerState  # set on the subclass that `make_server` builds

    # ---- plumbing -----------------------------------------------------------------------------

    def log_message(self, fmt, *args):  # headers (and so any API key) are never logged
        logger.info("%s %s", self.address_string(), fmt % args)

    def _cors(self) -> None:
        self.send_header("Access-Control-Allow-Origin", self.state.allowed_origins)
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "Content-Type, Authorization")

    def _send_bytes(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self._cors()
        self.end_headers()
        self.wfile.write(body)

    def _send_json(self, status: int, payload: dict) -> None:
        self._send_bytes(status, json.dumps(payload, ensure_ascii=False).encode(),
                         "application/json")

    def _send_error(self, status: int, message: str, param: Optional[str] = None,
                    code: Optional[str] = None) -> None:
        self._send_json(status, {"error": {"message": message,
                                           "type": _ERROR_TYPES.get(status, "invalid_request_error"),
                                           "param": param, "code": code}})

    def _authorized(self) -> bool:
        key = self.state.api_key
        if key is None:
            return True
        given = self.headers.get("Authorization", "")
        ok = given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), key.encode())
        if not ok:
            self._send_error(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                             code="invalid_api_key")
        return ok

    def _client_gone(self) -> bool:
        """True once the peer closed its side (checked while waiting, without reading data)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # ---- routes -------------------------------------------------------------------------------

    def do_OPTIONS(self):
        self.send_response(204)
        self._cors()
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            alive = self.state.engine.is_alive
            self._send_json(200 if alive else 503, {"status": "ok" if alive else "engine stopped"})
        elif path == "/metrics":
            if self._authorized():
                self._send_bytes(200, render_prometheus(self.state.engine).encode(),
                                 "text/plain; version=0.0.4")
        elif path in ("/v1/models", f"/v1/models/{self.state.model_id}"):
            if self._authorized():
                card = {"id": self.state.model_id, "object": "model", "created": 0,
                        "owned_by": "mlx-paged"}
                self._send_json(200, card if path != "/v1/models" else
                                {"object": "list", "data": [card]})
        elif path.startswith("/v1/models/"):
            if self._authorized():
                self._send_error(404, f"model {path[len('/v1/models/'):]!r} is not served here; "
                                 f"this server serves {self.state.model_id!r}", "model",
                                 "model_not_found")
        else:
            self._send_error(404, f"no route for GET {path}")

    def do_POST(self):
        path = self.path.split("?", 1)[0].rstrip("/")
        routes = {"/v1/chat/completions": parse_chat, "/chat/completions": parse_chat,
                  "/v1/completions": parse_completion}
        if path not in routes:
            self.close_connection = True
            self._send_error(404, f"no route for POST {path}")
            return
        if not self._authorized():
            self.close_connection = True
            return
        with self.state.lock:
            self.state.active += 1
        try:
            self._handle_generation(routes[path])
        except InvalidRequestError as exc:
            self._send_error(exc.status, exc.message, exc.param, exc.code)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self.state.lock:
                self.state.active -= 1

    def _read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            self.close_connection = True
            raise InvalidRequestError("a Content-Length header is required", status=411)
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise InvalidRequestError("Content-Length is not an integer") from None
        if n > self.state.max_request_bytes:
            self.close_connection = True
            self._discard_body(n)
            raise InvalidRequestError(
                f"the request body is {n} bytes; the limit is {self.state.max_request_bytes} "
                f"(--max-request-bytes)", status=413, code="request_too_large")
        return self.rfile.read(n)

    def _discard_body(self, n: int) -> None:
        """Read and drop a refused body (up to 64 MiB), so the client, still sending, reads our
        413 instead of a reset connection."""
        left = min(n, 64 * 1024 * 1024)
        try:
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 20))
                if not chunk:
                    break
                left -= len(chunk)
        except OSError:
            pass

    def _handle_generation(self, parse) -> None:
        state = self.state
        body = parse_json_body(self._read_body())
        if state.shutting_down:
            raise InvalidRequestError("the server is shutting down", status=503)
        req: ParsedRequest = parse(body, state.engine.tokenizer, state.defaults)
        if req.model is not None and req.model not in state.model_aliases:
            raise InvalidRequestError(
                f"model {req.model!r} is not served here; this server serves "
                f"{state.model_id!r}", param="model", status=404, code="model_not_found")
        state.engine.check_request(req.prompt_token_ids, req.params, req.max_tokens_explicit)
        if not state.engine.is_alive:
            raise InvalidRequestError("the engine is not running", status=503)
        stream = state.engine.add_request(req.prompt_token_ids, req.params)
        builder = ResponseBuilder(req.kind, state.model_id, req.tokens_as_ids)
        tokenizer = state.engine.tokenizer
        tools = None
        if req.tools and tokenizer.has_tool_calling:
            tools = ToolCallExtractor(tokenizer.tool_call_start, tokenizer.tool_call_end,
                                      tokenizer.tool_parser, req.tools)
        if req.stream:
            self._stream_response(req, stream, builder, tools)
        else:
            self._full_response(req, stream, builder, tools)

    def _outputs(self, stream):
        """Yield engine outputs; cancel the request if the client hangs up meanwhile."""
        while True:
            try:
                out = stream.get(timeout=0.25)
            except queue.Empty:
                if self._client_gone():
                    stream.cancel()
                    return
                continue
            yield out
            if out.finished:
                return

    @staticmethod
    def _final_reason(out, tools) -> str:
        if out.finish_reason == "stop" and tools is not None and tools.num_calls:
            return "tool_calls"
        return out.finish_reason

    def _full_response(self, req, stream, builder, tools) -> None:
        text, calls, logprobs, last = [], [], [], None
        for out in self._outputs(stream):
            last = out
            piece, new_calls = tools.feed(out.text) if tools else (out.text, [])
            text.append(piece)
            calls += new_calls
            logprobs += out.logprobs
        if last is None or not last.finished:
            return  # the client left; nobody to answer
        if last.error or last.finish_reason == "abort":
            raise InvalidRequestError(last.error or "the request was cancelled",
                                      status=503 if self.state.shutting_down else 500)
        if tools:
            piece, new_calls = tools.flush()
            text.append(piece)
            calls += new_calls
        self._send_json(200, builder.full(
            text="".join(text), tool_calls=calls, logprobs=logprobs,
            want_logprobs=req.logprobs, finish_reason=self._final_reason(last, tools),
            usage_body=usage(last.num_prompt_tokens, last.num_generated_tokens,
                             last.num_cached_tokens)))

    def _stream_response(self, req, stream, builder, tools) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self._cors()
        self.end_headers()
        self.close_connection = True
        try:
            if req.kind == "chat":
                self.wfile.write(sse_event(builder.chunk(role=True)))
            for out in self._outputs(stream):
                if out.error or out.finish_reason == "abort":
                    message = out.error or "the request was cancelled"
                    self.wfile.write(sse_event({"error": {"message": message,
                                                          "type": "server_error",
                                                          "param": None, "code": None}}))
                    break
                piece, calls = tools.feed(out.text) if tools else (out.text, [])
                if out.finished and tools:
                    rest, more = tools.flush()
                    piece, calls = piece + rest, calls + more
                if piece or calls or (out.logprobs and req.logprobs):
                    self.wfile.write(sse_event(builder.chunk(
                        text=piece, tool_calls=calls, logprobs=out.logprobs,
                        want_logprobs=req.logprobs)))
                if out.finished:
                    self.wfile.write(sse_event(builder.chunk(
                        finish_reason=self._final_reason(out, tools))))
                    if req.include_usage:
                        self.wfile.write(sse_event(builder.usage_chunk(usage(
                            out.num_prompt_tokens, out.num_generated_tokens,
                            out.num_cached_tokens))))
                self.wfile.flush()
            self.wfile.write(SSE_DONE)
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, OSError):
            stream.cancel()


class _Server(ThreadingHTTPServer):
    # The stdlib's listen backlog of 5 resets connections when many clients arrive at once.
    request_queue_size = 512


def make_server(state: ServerState, host: str, port: int) -> ThreadingHTTPServer:
    """Bind the HTTP server (not started) with a handler class bound to `state`."""
    handler = type("BoundAPIHandler", (APIHandler,), {"state": state})
    server = _Server((host, port), handler)
    server.daemon_threads = True
    return server


def wait_for_idle(state: ServerState, timeout: float) -> bool:
    """Wait until no request is in flight; False if `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with state.lock:
            if state.active == 0:
                return True
        time.sleep(0.05)
    return False
