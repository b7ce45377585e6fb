"""Answers of the Anthropic Messages route, `POST /v1/messages`: whole, or streamed as
Anthropic's named events. It shares the completion routes' engine path, client watch and
tool-call parsing; only the request and response shapes differ."""

from __future__ import annotations

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.anthropic_response import (
    PING,
    MessageStream,
    error_event,
    message,
    new_message_id,
    thinking_block,
    tool_use_block,
)
from mlx_paged.server.client_liveness import INTERIM_CONTINUE, ClientWatch

COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"


class AnthropicMixin:
    """Anthropic's answers for the HTTP handler (which provides `state`, `wfile`, the send
    helpers and `GenerationMixin`'s `_outputs`)."""

    def answer_message(self, req, stream, parser) -> None:
        """Answer a queued `/v1/messages` request, whole or streamed (`parser`: an
        `AnswerParser`)."""
        model = self.state.model_id
        if req.stream:
            self._stream_message(req, stream, parser, model)
        else:
            self._whole_message(stream, parser, model)

    def _whole_message(self, stream, parser, model: str) -> None:
        probe = (
            (lambda: self._write_now(INTERIM_CONTINUE))
            if self.request_version == "HTTP/1.1"
            else None
        )
        watch = ClientWatch(self.connection, probe, max_probes=2)
        thought, text, calls, last = [], [], [], None
        for out in self._outputs(stream, watch):
            last = out
            thinking, piece, new_calls = parser.feed(out.text)
            thought.append(thinking)
            text.append(piece)
            calls += new_calls
        if last is None or not last.finished:
            self.close_connection = True
            return  # the client left; nobody to answer
        if last.error or last.finish_reason == "abort":
            raise InvalidRequestError(
                last.error or "the request was cancelled",
                status=503 if self.state.shutting_down else 500,
            )
        thinking, piece, new_calls = parser.flush()
        thought.append(thinking)
        text.append(piece)
        calls += new_calls
        thought, joined = "".join(thought), "".join(text)
        content = [thinking_block(thought)] if thought else []
        # An empty text block only where there is nothing else to say.
        content += [{"type": "text", "text": joined}] if joined or not (calls or thought) else []
        content += [tool_use_block(call) for call in calls]
        self._send_json(200, message(new_message_id(), model, content, last))

    def _stream_message(self, req, stream, parser, model: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self._cors()
        self.end_headers()
        self.close_connection = True
        events = MessageStream(new_message_id(), model, len(req.prompt_token_ids))
        watch = ClientWatch(self.connection, lambda: self._write_now(PING))
        try:
            self._write_now(events.start())
            for out in self._outputs(stream, watch):
                if out.error or out.finish_reason == "abort":
                    self._write_now(error_event(out.error or "the request was cancelled"))
                    return
                self._write_now(_increment(events, parser, out))
        except OSError:  # the client went away mid-stream
            stream.cancel()
        except Exception:
            stream.cancel()
            try:
                self._write_now(error_event("internal server error"))
            except OSError:
                pass
            raise


def _increment(events: MessageStream, parser, out) -> bytes:
    """The events of one engine output: its thinking, text and tool calls, and the end if it
    is the last."""
    thinking, piece, calls = parser.feed(out.text)
    if out.finished:
        more_thinking, rest, more = parser.flush()
        thinking, piece, calls = thinking + more_thinking, piece + rest, calls + more
    data = events.thinking(thinking) + events.text(piece)
    data += b"".join(events.tool_call(call) for call in calls)
    return data + (events.finish(out) if out.finished else b"")
