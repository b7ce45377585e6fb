"""Parse and validate OpenAI request bodies into a prompt and `SamplingParams`.

Every refusal is an `InvalidRequestError` naming the field to fix; the HTTP layer turns it into
OpenAI's error shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlx_paged.errors import InvalidRequestError
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.server.request_fields import err as _err
from mlx_paged.server.request_fields import sampling_params as _sampling_params
from mlx_paged.server.request_fields import typed as _typed

ROLES = ("system", "developer", "user", "assistant", "tool")

# Accepted and ignored: they change nothing a single local model could honour.
IGNORED_FIELDS = {
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
    "tool_choice",
    "stream_options",
    "chat_template_kwargs",
    "role_mapping",
}


@dataclass
class ParsedRequest:
    """A validated request, ready for `Engine.add_request`."""

    kind: str  # "chat" or "completion"
    model: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens_explicit: bool
    stream: bool = False
    include_usage: bool = False
    tools: list | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    tokens_as_ids: bool = False  # vLLM's return_tokens_as_token_ids: "token_id:<id>" strings


def _check_unsupported(body: dict) -> None:
    for name in ("n", "best_of"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or value != 1):
            raise _err(
                f"{name}: only {name}=1 is supported; send several requests for several "
                f"completions",
                name,
            )
    if body.get("echo"):
        raise _err("echo: echoing the prompt is not supported", "echo")
    if body.get("suffix"):
        raise _err("suffix: insertion (suffix) is not supported", "suffix")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _err("response_format: only {'type': 'text'} is supported", "response_format")
    for name in ("functions", "function_call", "audio", "prediction", "logit_bias_schema"):
        if body.get(name) is not None:
            raise _err(f"{name}: this parameter is not supported", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _err("modalities: only ['text'] is supported", "modalities")


def _message_text(message: dict, index: int) -> str | None:
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _err(
                    f"messages[{index}].content: part type {kind!r} is not supported; "
                    f"this server takes text only",
                    "messages",
                )
            if not isinstance(part.get("text"), str):
                raise _err(
                    f"messages[{index}].content: a text part needs a string 'text'", "messages"
                )
            parts.append(part["text"])
        return "".join(parts)
    raise _err(f"messages[{index}].content must be a string or a list of text parts", "messages")


def _chat_messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if messages is None:
        raise _err("messages is required", "messages")
    if not isinstance(messages, list) or not messages:
        raise _err("messages must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _err(f"messages[{i}] must be an object with 'role' and 'content'", "messages")
        role = m.get("role")
        if role not in ROLES:
            raise _err(
                f"messages[{i}].role must be one of {', '.join(ROLES)}; got {role!r}", "messages"
            )
        msg = {"role": role, "content": _message_text(m, i)}
        if msg["content"] is None and not m.get("tool_calls"):
            raise _err(f"messages[{i}].content is required", "messages")
        if m.get("tool_calls"):
            if not isinstance(m["tool_calls"], list):
                raise _err(f"messages[{i}].tool_calls must be a list", "messages")
            msg["tool_calls"] = [_tool_call_for_template(tc) for tc in m["tool_calls"]]
        for key in ("name", "tool_call_id"):
            if key in m:
                if not isinstance(m[key], str):
                    raise _err(f"messages[{i}].{key} must be a string", "messages")
                msg[key] = m[key]
        out.append(msg)
    return out


def _tool_call_for_template(tool_call: Any) -> dict:
    # Templates expect arguments as a mapping; the API carries them as a JSON string.
    if not isinstance(tool_call, dict) or not isinstance(tool_call.get("function"), dict):
        raise _err("tool_calls entries need a 'function' object", "messages")
    fn = dict(tool_call["function"])
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            raise _err("tool_calls[].function.arguments is not valid JSON", "messages") from None
    return {**tool_call, "function": fn}


def parse_chat(body: dict, tokenizer, defaults: dict) -> ParsedRequest:
    """Validate a `/v1/chat/completions` body and render its prompt with the chat template."""
    _check_unsupported(body)
    messages = _chat_messages(body)
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _err("tools must be a list of tool objects", "tools")
        if tools and not tokenizer.has_tool_calling:
            raise _err("tools: this model's chat template does not support tool calling", "tools")
    params, explicit = _sampling_params(body, defaults, chat=True)
    stream, include_usage = _stream_flags(body)
    try:
        if tokenizer.has_chat_template:
            ids = tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True
            )
        else:
            text = "".join(f"{m['role']}: {m['content'] or ''}\n" for m in messages)
            ids = tokenizer.encode(text + "assistant: ")
    except InvalidRequestError:
        raise
    except Exception as exc:  # a template raising on odd input is the client's to fix
        raise _err(
            f"messages could not be rendered with the chat template: {exc}", "messages"
        ) from None
    return ParsedRequest(
        "chat",
        _model_name(body),
        list(ids),
        params,
        explicit,
        stream,
        include_usage,
        tools or None,
        params.logprobs,
        params.top_logprobs,
        _tokens_as_ids(body),
    )


def parse_completion(body: dict, tokenizer, defaults: dict) -> ParsedRequest:
    """Validate a `/v1/completions` body; the prompt is text or token ids, one prompt."""
    _check_unsupported(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise _err("prompt is required", "prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise _err("prompt must not be empty", "prompt")
        ids = list(tokenizer.encode(prompt))
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        ids = list(prompt)
    else:
        raise _err(
            "prompt must be a non-empty string or a list of token ids (one prompt per request)",
            "prompt",
        )
    params, explicit = _sampling_params(body, defaults, chat=False)
    stream, include_usage = _stream_flags(body)
    return ParsedRequest(
        "completion",
        _model_name(body),
        ids,
        params,
        explicit,
        stream,
        include_usage,
        None,
        params.logprobs,
        params.top_logprobs,
        _tokens_as_ids(body),
    )


def _model_name(body: dict) -> str | None:
    return _typed(body, "model", str, None, label="a string")


def _tokens_as_ids(body: dict) -> bool:
    return _typed(body, "return_tokens_as_token_ids", bool, False, label="a boolean")


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = _typed(body, "stream", bool, False, label="a boolean")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _err("stream_options must be an object", "stream_options")
    include_usage = bool((options or {}).get("include_usage", False))
    if options and not stream:
        raise _err("stream_options is only allowed with stream: true", "stream_options")
    return stream, include_usage
