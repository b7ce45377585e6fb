"""Answers of the Anthropic Messages route, `POST /v1/messages`: whole, or streamed as
Anthropic's named events. It shares the completion routes' engine path, client watch and
tool-call parsing; only the request and response shapes differ."""

from __future__ import annotations

from mlx_paged.server.anthropic_response import (
    PING,
    MessageStream,
    error_event,
    message,
    new_message_id,
    thinking_block,
    tool_use_block,
)
from mlx_paged.server.client_liveness import ClientWatch

COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"


class AnthropicMixin:
    """Anthropic's answers for the HTTP handler (which provides `state`, `wfile`, the send
    helpers and `GenerationMixin`'s `_whole_answer`, `_open_event_stream` and `_outputs`)."""

    def answer_message(self, req, stream, parser) -> None:
        """Answer a queued `/v1/messages` request, whole or streamed (`parser`: an
        `AnswerParser`)."""
        model = self.state.model_id
        if req.stream:
            self._stream_message(req, stream, parser, model)
        else:
            self._whole_message(stream, parser, model)

    def _whole_message(self, stream, parser, model: str) -> None:
        answer = self._whole_answer(stream, parser)
        if answer is None:
            return
        content = [thinking_block(answer.thinking)] if answer.thinking else []
        # An empty text block only where there is nothing else to say.
        if answer.text or not (answer.calls or answer.thinking):
            content.append({"type": "text", "text": answer.text})
        content += [tool_use_block(call) for call in answer.calls]
        self._send_json(200, message(new_message_id(), model, content, answer.last))

    def _stream_message(self, req, stream, parser, model: str) -> None:
        self._open_event_stream()
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
