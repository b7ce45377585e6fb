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

MAX_TOKENS_LIMIT = 1_000_000
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


def _err(message: str, param: str | None = None, status: int = 400, code: str | None = None):
    return InvalidRequestError(message, param=param, status=status, code=code)


def _typed(body: dict, name: str, types, default=None, *, label: str):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _err(f"{name} must be {label}, got a boolean", name)
    if not isinstance(value, types):
        raise _err(f"{name} must be {label}, got {type(value).__name__}", name)
    return value


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


def _sampling_params(body: dict, defaults: dict, *, chat: bool) -> tuple[SamplingParams, bool]:
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    explicit = max_tokens is not None
    if explicit:
        name = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
            raise _err(f"{name} must be an integer", name)
        if max_tokens < 1:
            raise _err(f"{name} must be at least 1, got {max_tokens}", name)
        if max_tokens > MAX_TOKENS_LIMIT:
            raise _err(
                f"{name} ({max_tokens}) is absurdly large; the limit is the model's context length",
                name,
            )
    else:
        max_tokens = defaults["max_tokens"]
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise _err("stop must be a string or a list of strings", "stop")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise _err("logit_bias must be an object mapping token ids to biases", "logit_bias")
        try:
            bias = {int(k): v for k, v in bias.items()}
        except (TypeError, ValueError):
            raise _err("logit_bias keys must be token ids (integers)", "logit_bias") from None
    if chat:
        logprobs = _typed(body, "logprobs", bool, False, label="a boolean")
        top = _typed(body, "top_logprobs", int, 0, label="an integer")
        if top and not logprobs:
            raise _err("top_logprobs needs logprobs: true", "top_logprobs")
    else:
        top = _typed(body, "logprobs", int, None, label="an integer")
        logprobs, top = top is not None, top or 0
    number = (int, float)
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_typed(body, "temperature", number, defaults["temperature"], label="a number"),
        top_p=_typed(body, "top_p", number, defaults["top_p"], label="a number"),
        top_k=_typed(body, "top_k", int, defaults["top_k"], label="an integer"),
        min_p=_typed(body, "min_p", number, defaults["min_p"], label="a number"),
        repetition_penalty=_typed(body, "repetition_penalty", number, None, label="a number"),
        repetition_context_size=_typed(
            body, "repetition_context_size", int, 20, label="an integer"
        ),
        presence_penalty=_typed(body, "presence_penalty", number, None, label="a number"),
        frequency_penalty=_typed(body, "frequency_penalty", number, None, label="a number"),
        xtc_probability=_typed(body, "xtc_probability", number, 0.0, label="a number"),
        xtc_threshold=_typed(body, "xtc_threshold", number, 0.1, label="a number"),
        logit_bias=bias,
        seed=_typed(body, "seed", int, None, label="an integer"),
        stop=stop,
        logprobs=logprobs,
        top_logprobs=top,
    )
    return params, explicit


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
