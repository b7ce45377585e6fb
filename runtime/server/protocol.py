"""Parse and validate OpenAI request bodies into a prompt and `SamplingParams`.

Every refusal is an `InvalidRequestError` naming the field to fix; the HTTP layer turns it into
OpenAI's error shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlx_paged.engine.chat_prompt import chat_messages, render_chat
from mlx_paged.engine.tool_prompt import forced_call, strict_calls
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.server.request_fields import err as _err
from mlx_paged.server.request_fields import sampling_params as _sampling_params
from mlx_paged.server.request_fields import typed as _typed
from mlx_paged.structured.grammars import (
    any_json_object_grammar,
    check_grammar,
    json_schema_grammar,
)


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
    for name in ("functions", "function_call", "audio", "prediction", "logit_bias_schema"):
        if body.get(name) is not None:
            raise _err(f"{name}: this parameter is not supported", name)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise _err("modalities: only ['text'] is supported", "modalities")


def _response_format(body: dict, tokenizer) -> str | None:
    """The grammar of `response_format` (`json_object`, `json_schema`), or None for text."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return any_json_object_grammar()
    if kind != "json_schema":
        raise _err("response_format: type must be 'text', 'json_object' or 'json_schema'",
                   "response_format")  # fmt: skip
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or "schema" not in spec:
        raise _err(
            "response_format: json_schema needs an object with a 'schema'", "response_format"
        )
    grammar = json_schema_grammar(spec["schema"], "response_format")
    check_grammar(grammar, tokenizer._tokenizer, "response_format")
    return grammar


def _tool_choice(body: dict, tools, tokenizer) -> tuple[list | None, str | None, list[int]]:
    """The tools to offer, the grammar of a forced call (`required` or a named function) or
    of a strict tool's call under `auto`, and the token ids after which that one starts."""
    choice = body.get("tool_choice")
    if choice is None or choice == "auto":
        grammar, after = strict_calls(tokenizer, tools, "tools") or (None, [])
        return tools, grammar, after
    if choice == "none":
        return None, None, []  # not offered, so not called
    function = choice.get("function") if isinstance(choice, dict) else None
    if choice == "required":
        name = None
    elif isinstance(function, dict) and isinstance(function.get("name"), str):
        name = function["name"]
    else:
        raise _err("tool_choice must be 'auto', 'none', 'required' or "
                   "{'type': 'function', 'function': {'name': ...}}", "tool_choice")  # fmt: skip
    return tools, forced_call(tokenizer, tools, name, "tool_choice"), []


def parse_chat(body: dict, tokenizer, defaults: dict) -> ParsedRequest:
    """Validate a `/v1/chat/completions` body and render its prompt with the chat template."""
    _check_unsupported(body)
    messages = chat_messages(body.get("messages"))
    tools, forced, after = _tool_choice(body, body.get("tools"), tokenizer)
    params, explicit = _sampling_params(body, defaults, chat=True)
    params.grammar = _response_format(body, tokenizer)
    if forced is not None and params.grammar is not None:
        raise _err("response_format and a forced or strict tool call cannot both shape one "
                   "answer", "tool_choice")  # fmt: skip
    params.grammar, params.grammar_after = forced or params.grammar, after
    stream, include_usage = _stream_flags(body)
    ids = render_chat(tokenizer, messages, tools, body.get("chat_template_kwargs"))
    return ParsedRequest(
        "chat",
        _model_name(body),
        ids,
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
    params.grammar = _response_format(body, tokenizer)
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
