"""The completion routes: validate, queue on the engine, answer whole or as a stream of SSE
events, and cancel the request when its client hangs up."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass

from mlx_paged.engine.outputs import RequestOutput
from mlx_paged.engine.tool_prompt import TOOL_CALL_END, TOOL_CALL_START, parse_tool_call
from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.anthropic_request import count_tokens, parse_messages
from mlx_paged.server.anthropic_routes import COUNT_TOKENS_ROUTE, AnthropicMixin
from mlx_paged.server.client_liveness import INTERIM_CONTINUE, KEEPALIVE_COMMENT, ClientWatch
from mlx_paged.server.protocol import ParsedRequest, parse_chat, parse_completion
from mlx_paged.server.reasoning import AnswerParser, reasoning_splitter
from mlx_paged.server.responses import SSE_DONE, ResponseBuilder, sse_event, usage
from mlx_paged.server.tool_calls import ToolCallExtractor

WATCH_SECONDS = 0.25  # how often a waiting request looks whether its client hung up

PARSERS = {
    "/v1/chat/completions": parse_chat,
    "/chat/completions": parse_chat,
    "/v1/completions": parse_completion,
    "/v1/messages": parse_messages,
}


def _sse_error(message: str) -> bytes:
    return sse_event(
        {"error": {"message": message, "type": "server_error", "param": None, "code": None}}
    )


@dataclass
class WholeAnswer:
    """A finished request's output, parsed (`AnswerParser`)."""

    thinking: str
    text: str
    calls: list[dict]
    logprobs: list
    last: RequestOutput  # the final output: finish reason and token counts


class GenerationMixin(AnthropicMixin):
    """Completion handling for the HTTP handler (which provides `state`, `wfile` and the
    send helpers)."""

    def handle_generation(self, path: str, body: dict) -> None:
        state = self.state
        if state.shutting_down:
            raise InvalidRequestError("the server is shutting down", status=503)
        state.guard.busy(self.connection)
        if path == COUNT_TOKENS_ROUTE:
            self._send_json(200, count_tokens(body, state.engine.tokenizer))
            return
        req: ParsedRequest = PARSERS[path](body, state.engine.tokenizer, state.defaults)
        state.unknown_fields.note(req.kind, body)
        del body  # all that is needed is parsed; a large body is not held while it generates
        parser = self._answer_parser(req)
        thinking = parser.reasoning and parser.reasoning.thinking
        if req.params.grammar is not None and thinking and not req.params.grammar_after:
            # The template opened a thinking block: the grammar is the answer's, after it.
            req.params.grammar_after = list(state.engine.tokenizer.think_end_tokens)
        stream = self._queue(req)
        if req.kind == "messages":
            self.answer_message(req, stream, parser)
            return
        builder = ResponseBuilder(req.kind, state.model_id, req.tokens_as_ids)
        if req.stream:
            self._stream_response(req, stream, builder, parser)
        else:
            self._full_response(req, stream, builder, parser)

    def _queue(self, req: ParsedRequest):
        """Check `req` against the served model and the engine's limits, and queue it; its
        output stream."""
        state = self.state
        if req.model is not None and req.model not in state.model_aliases:
            raise InvalidRequestError(
                f"model {req.model!r} is not served here; this server serves {state.model_id!r}",
                param="model",
                status=404,
                code="model_not_found",
            )
        state.engine.check_request(req.prompt_token_ids, req.params, req.max_tokens_explicit)
        if not state.engine.is_alive:
            raise InvalidRequestError("the engine is not running", status=503)
        return state.engine.add_request(req.prompt_token_ids, req.params)

    def _answer_parser(self, req: ParsedRequest) -> AnswerParser:
        """What splits `req`'s output into thinking, text and tool calls (a chat answer's;
        a completion's output is all text)."""
        tokenizer = self.state.engine.tokenizer
        chat = req.kind != "completion"
        reasoning = reasoning_splitter(tokenizer, req.prompt_token_ids) if chat else None
        return AnswerParser(reasoning, self._tool_extractor(req))

    def _tool_extractor(self, req: ParsedRequest) -> ToolCallExtractor | None:
        """The parser of the tool calls in `req`'s output, where it offers tools."""
        tokenizer = self.state.engine.tokenizer
        if not req.tools:
            return None
        if not tokenizer.has_tool_calling:  # the tools were offered in the default format
            return ToolCallExtractor(TOOL_CALL_START, TOOL_CALL_END, parse_tool_call, req.tools)
        return ToolCallExtractor(
            tokenizer.tool_call_start, tokenizer.tool_call_end, tokenizer.tool_parser, req.tools
        )

    def _write_now(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _outputs(self, stream, watch: ClientWatch):
        """Yield engine outputs; cancel the request if the client hangs up meanwhile. The
        client is looked at every `WATCH_SECONDS` even while outputs keep coming, so a fast
        engine does not run a long request for a client that left."""
        next_look = time.monotonic() + WATCH_SECONDS
        while True:
            try:
                out = stream.get(timeout=WATCH_SECONDS)
            except queue.Empty:
                out = None
            if out is None or time.monotonic() >= next_look:
                if watch.gone():
                    stream.cancel()
                    return
                next_look = time.monotonic() + WATCH_SECONDS
            if out is None:
                continue
            yield out
            if out.finished:
                return

    @staticmethod
    def _final_reason(out, parser: AnswerParser) -> str:
        if out.finish_reason == "stop" and parser.num_calls:
            return "tool_calls"
        return out.finish_reason

    def _whole_answer(self, stream, parser: AnswerParser) -> WholeAnswer | None:
        """Every output of `stream` gathered and parsed; None if the client left first."""
        # An interim 100 is the one thing HTTP/1.1 lets us write before the reply.
        probe = (
            (lambda: self._write_now(INTERIM_CONTINUE))
            if self.request_version == "HTTP/1.1"
            else None
        )
        watch = ClientWatch(self.connection, probe, max_probes=2)
        thought, text, calls, logprobs, last = [], [], [], [], None
        for out in self._outputs(stream, watch):
            last = out
            thinking, piece, new_calls = parser.feed(out.text)
            thought.append(thinking)
            text.append(piece)
            calls += new_calls
            logprobs += out.logprobs
        if last is None or not last.finished:
            self.close_connection = True
            return None  # the client left; nobody to answer
        if last.error or last.finish_reason == "abort":
            raise InvalidRequestError(
                last.error or "the request was cancelled",
                status=503 if self.state.shutting_down else 500,
            )
        thinking, piece, new_calls = parser.flush()
        return WholeAnswer(
            "".join(thought) + thinking, "".join(text) + piece, calls + new_calls, logprobs, last
        )

    def _full_response(self, req, stream, builder, parser: AnswerParser) -> None:
        answer = self._whole_answer(stream, parser)
        if answer is None:
            return
        last = answer.last
        self._send_json(
            200,
            builder.full(
                reasoning=answer.thinking,
                text=answer.text,
                tool_calls=answer.calls,
                logprobs=answer.logprobs,
                want_logprobs=req.logprobs,
                finish_reason=self._final_reason(last, parser),
                usage_body=usage(
                    last.num_prompt_tokens, last.num_generated_tokens, last.num_cached_tokens
                ),
            ),
        )

    def _open_event_stream(self) -> None:
        """Send the head of a server-sent-events reply; the connection closes after it."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self._cors()
        self.end_headers()
        self.close_connection = True

    def _stream_response(self, req, stream, builder, parser: AnswerParser) -> None:
        self._open_event_stream()
        watch = ClientWatch(self.connection, lambda: self._write_now(KEEPALIVE_COMMENT))
        try:
            if req.kind == "chat":
                self.wfile.write(sse_event(builder.chunk(role=True)))
            for out in self._outputs(stream, watch):
                if out.error or out.finish_reason == "abort":
                    self.wfile.write(_sse_error(out.error or "the request was cancelled"))
                    break
                self._write_increment(req, builder, parser, out)
                self.wfile.flush()
            self.wfile.write(SSE_DONE)
            self.wfile.flush()
        except OSError:  # the client went away mid-stream
            stream.cancel()
        except Exception:
            stream.cancel()
            self._end_stream_with_error("internal server error")
            raise

    def _write_increment(self, req, builder, parser: AnswerParser, out) -> None:
        thinking, piece, calls = parser.feed(out.text)
        if out.finished:
            more_thinking, rest, more = parser.flush()
            thinking, piece, calls = thinking + more_thinking, piece + rest, calls + more
        if thinking or piece or calls or (out.logprobs and req.logprobs):
            self.wfile.write(
                sse_event(
                    builder.chunk(
                        reasoning=thinking,
                        text=piece,
                        tool_calls=calls,
                        logprobs=out.logprobs,
                        want_logprobs=req.logprobs,
                    )
                )
            )
        if out.finished:
            reason = self._final_reason(out, parser)
            self.wfile.write(sse_event(builder.chunk(finish_reason=reason)))
            if req.include_usage:
                self.wfile.write(
                    sse_event(
                        builder.usage_chunk(
                            usage(
                                out.num_prompt_tokens,
                                out.num_generated_tokens,
                                out.num_cached_tokens,
                            )
                        )
                    )
                )

    def _end_stream_with_error(self, message: str) -> None:
        try:
            self.wfile.write(_sse_error(message))
            self.wfile.write(SSE_DONE)
            self.wfile.flush()
        except OSError:
            pass
