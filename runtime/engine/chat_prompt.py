"""A conversation to prompt token ids: messages validated, then rendered by the model's chat
template. The HTTP server and the Python API (`LLM.chat`, `AsyncLLM`) share it."""

from __future__ import annotations

import json
from typing import Any

from mlx_paged.engine.tool_prompt import with_tool_prompt
from mlx_paged.errors import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")
# Template variables a request may not set: the server sets them itself.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "add_generation_prompt", "tokenize", "return_dict",
     "continue_final_message", "tokenizer_kwargs", "chat_template"}
)  # fmt: skip


def _err(message: str, param: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=param)


def render_chat(
    tokenizer, messages: list[dict], tools: list | None = None, template_kwargs: dict | None = None
) -> list[int]:
    """Prompt token ids of validated `messages` (see `chat_messages`) with the generation prompt
    appended; a model without a chat template gets `role: content` lines.

    Args:
        tools: OpenAI function tools: rendered by templates that take them, written into the
            system turn for the others (`tool_prompt.with_tool_prompt`).
        template_kwargs: extra template variables (e.g. `{"enable_thinking": False}`).
    """
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise _err("tools must be a list of tool objects", "tools")
        if tools and not tokenizer.has_tool_calling:  # the tools go in the system turn
            messages, tools = with_tool_prompt(messages, tools), None
    kwargs = _template_kwargs(template_kwargs)
    if kwargs and not tokenizer.has_chat_template:
        raise _err("chat_template_kwargs: this model has no chat template", "chat_template_kwargs")
    try:
        if tokenizer.has_chat_template:
            ids = tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=True, tokenize=True, **kwargs
            )
        else:
            text = "".join(f"{m['role']}: {m['content'] or ''}\n" for m in messages)
            ids = tokenizer.encode(text + "assistant: ")
    except Exception as exc:  # a template raising on odd input is the client's to fix
        raise _err(
            f"messages could not be rendered with the chat template: {exc}", "messages"
        ) from None
    return list(ids)


def _template_kwargs(kwargs) -> dict:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise _err("chat_template_kwargs must be an object", "chat_template_kwargs")
    reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(kwargs))
    if reserved:
        raise _err(
            f"chat_template_kwargs: {', '.join(reserved)} is set by the server, not the request",
            "chat_template_kwargs",
        )
    return kwargs


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


def chat_messages(messages) -> list[dict]:
    """Validate a conversation (OpenAI's `messages`) into what chat templates take: text
    content, and tool-call arguments as mappings.

    Raises:
        InvalidRequestError: naming `messages` and the entry at fault.
    """
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
