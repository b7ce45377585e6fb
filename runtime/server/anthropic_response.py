"""Anthropic Messages response bodies and stream events, built from engine outputs."""

from __future__ import annotations

import json
import uuid

from mlx_paged.engine.outputs import RequestOutput

# Engine finish reasons to Anthropic's stop reasons (a tool call makes it "tool_use").
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens"}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def tool_use_block(call: dict) -> dict:
    """A `tool_use` content block from a parsed tool call (`ToolCallExtractor`'s)."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except json.JSONDecodeError:
        arguments = {"arguments": function["arguments"]}  # kept whole, not lost
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    call_id = call["id"].replace("call_", "toolu_", 1)
    return {"type": "tool_use", "id": call_id, "name": function["name"], "input": arguments}


def thinking_block(thought: str) -> dict:
    """A `thinking` content block (no signature: nothing here signs reasoning)."""
    return {"type": "thinking", "thinking": thought, "signature": ""}


def stop_reason(last: RequestOutput, num_calls: int) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished request."""
    if last.stop_string is not None:
        return "stop_sequence", last.stop_string
    if last.finish_reason == "stop" and num_calls:
        return "tool_use", None
    return STOP_REASONS.get(last.finish_reason, "end_turn"), None


def usage(last: RequestOutput) -> dict:
    """Anthropic's usage: input tokens not read from the prefix cache, and those that were."""
    cached = last.num_cached_tokens
    return {
        "input_tokens": last.num_prompt_tokens - cached,
        "output_tokens": last.num_generated_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def message(message_id: str, model: str, content: list[dict], last: RequestOutput | None) -> dict:
    """The whole `message` object: finished (`last` given), or as `message_start` opens it."""
    reason, sequence = (None, None) if last is None else stop_reason(last, _calls(content))
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(last) if last is not None else None,
    }


def _calls(content: list[dict]) -> int:
    return sum(block["type"] == "tool_use" for block in content)


def sse(event: str, payload: dict) -> bytes:
    """One named server-sent event, as Anthropic streams them."""
    data = json.dumps({"type": event, **payload}, ensure_ascii=False)
    return f"event: {event}\ndata: {data}\n\n".encode()


PING = sse("ping", {})


class MessageStream:
    """The event sequence of one streamed message: each text increment and tool call becomes
    a content block's start, deltas and stop, in order."""

    def __init__(self, message_id: str, model: str, num_prompt_tokens: int):
        self.message_id, self.model = message_id, model
        self.num_prompt_tokens = num_prompt_tokens
        self._open: str | None = None  # the open block's type
        self._index = -1
        self.num_calls = 0

    def start(self) -> bytes:
        opening = message(self.message_id, self.model, [], None)
        opening["usage"] = {"input_tokens": self.num_prompt_tokens, "output_tokens": 0}
        return sse("message_start", {"message": opening})

    def text(self, piece: str) -> bytes:
        if not piece:
            return b""
        head = b"" if self._open == "text" else self._begin({"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": piece}
        return head + sse("content_block_delta", {"index": self._index, "delta": delta})

    def thinking(self, piece: str) -> bytes:
        if not piece:
            return b""
        head = b"" if self._open == "thinking" else self._begin(thinking_block(""))
        delta = {"type": "thinking_delta", "thinking": piece}
        return head + sse("content_block_delta", {"index": self._index, "delta": delta})

    def tool_call(self, call: dict) -> bytes:
        block = tool_use_block(call)
        self.num_calls += 1
        head = self._begin({**block, "input": {}})
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        return head + sse("content_block_delta", {"index": self._index, "delta": delta})

    def finish(self, last: RequestOutput) -> bytes:
        reason, sequence = stop_reason(last, self.num_calls)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return (
            self._close()
            + sse("message_delta", {"delta": delta, "usage": usage(last)})
            + sse("message_stop", {})
        )

    def _begin(self, block: dict) -> bytes:
        head = self._close()
        self._index += 1
        self._open = block["type"]
        return head + sse("content_block_start", {"index": self._index, "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse("content_block_stop", {"index": self._index})


def error_event(message: str) -> bytes:
    """The event that ends a stream which failed after it started."""
    return sse("error", {"error": {"type": "api_error", "message": message}})
