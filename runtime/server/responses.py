"""OpenAI response bodies and stream chunks, built from engine outputs."""

from __future__ import annotations

import json
import time
import uuid

from mlx_paged.engine.outputs import TokenLogprob

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: dict) -> bytes:
    """One server-sent event carrying a JSON payload."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def _finite(x: float) -> float:
    # JSON has no -Infinity; a masked token's log-probability is reported as a large negative.
    return x if x > -9999.0 else -9999.0


def _name(token_id: int, text: str, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else text


def chat_logprobs(entries: list[TokenLogprob], as_ids: bool = False) -> dict:
    def item(token_id: int, token: str, logprob: float) -> dict:
        name = _name(token_id, token, as_ids)
        return {"token": name, "logprob": _finite(logprob), "bytes": list(name.encode())}

    return {
        "content": [
            {
                **item(e.token_id, e.token, e.logprob),
                "top_logprobs": [item(i, t, lp) for i, t, lp in e.top_logprobs],
            }
            for e in entries
        ]
    }


def completion_logprobs(
    entries: list[TokenLogprob], text_offset: int, as_ids: bool = False
) -> dict:
    offsets, pos = [], text_offset
    for e in entries:
        offsets.append(pos)
        pos += len(e.token)
    return {
        "tokens": [_name(e.token_id, e.token, as_ids) for e in entries],
        "token_logprobs": [_finite(e.logprob) for e in entries],
        "top_logprobs": [
            {_name(i, t, as_ids): _finite(lp) for i, t, lp in e.top_logprobs} for e in entries
        ],
        "text_offset": offsets,
    }


def usage(num_prompt: int, num_completion: int, num_cached: int = 0) -> dict:
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": num_completion,
        "total_tokens": num_prompt + num_completion,
        "prompt_tokens_details": {"cached_tokens": num_cached},
    }


class ResponseBuilder:
    """Shapes one request's output as chat or text completion objects."""

    def __init__(self, kind: str, model: str, tokens_as_ids: bool = False):
        self.kind = kind
        self.tokens_as_ids = tokens_as_ids
        self.model = model
        self.id = new_id(kind)
        self.created = int(time.time())
        self.text_offset = 0

    def _envelope(self, chunk: bool) -> dict:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, entries: list[TokenLogprob], wanted: bool) -> dict | None:
        if not wanted:
            return None
        if self.kind == "chat":
            return chat_logprobs(entries, self.tokens_as_ids)
        return completion_logprobs(entries, self.text_offset, self.tokens_as_ids)

    def chunk(
        self,
        *,
        text: str = "",
        role: bool = False,
        tool_calls: list | None = None,
        logprobs: list[TokenLogprob] | None = None,
        want_logprobs: bool = False,
        finish_reason: str | None = None,
        reasoning: str = "",
    ) -> dict:
        """A streamed increment (`reasoning`: thinking, as `reasoning_content`)."""
        body = self._envelope(chunk=True)
        if self.kind == "chat":
            delta: dict = {}
            if role:
                delta["role"] = "assistant"
            if reasoning:
                delta["reasoning_content"] = reasoning
            if text or role:
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = self._logprobs(logprobs or [], want_logprobs and bool(logprobs))
        choice["finish_reason"] = finish_reason
        self.text_offset += len(text)
        body["choices"] = [choice]
        return body

    def usage_chunk(self, usage_body: dict) -> dict:
        return {**self._envelope(chunk=True), "choices": [], "usage": usage_body}

    def full(
        self,
        *,
        text: str,
        tool_calls: list,
        logprobs: list[TokenLogprob],
        want_logprobs: bool,
        finish_reason: str | None,
        usage_body: dict,
        reasoning: str = "",
    ) -> dict:
        """The whole, non-streamed response (`reasoning`: thinking, as `reasoning_content`)."""
        body = self._envelope(chunk=False)
        if self.kind == "chat":
            # OpenAI's: a reply of tool calls alone has no content, not an empty one.
            message: dict = {"role": "assistant", "content": text or (None if tool_calls else "")}
            if reasoning:
                message["reasoning_content"] = reasoning
            if tool_calls:
                message["tool_calls"] = [
                    {k: v for k, v in c.items() if k != "index"} for c in tool_calls
                ]
            choice = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = self._logprobs(logprobs, want_logprobs)
        choice["finish_reason"] = finish_reason
        body["choices"] = [choice]
        body["usage"] = usage_body
        return body
