"""Parse and validate Anthropic Messages bodies (`POST /v1/messages`) into a prompt and
`SamplingParams`: content blocks become the chat template's messages (text, tool calls, tool
results), Anthropic's tools become function tools.

Every refusal is an `InvalidRequestError` naming the field to fix; the HTTP layer turns it into
Anthropic's error shape.
"""

from __future__ import annotations

from mlx_paged.engine.chat_prompt import chat_messages, render_chat
from mlx_paged.engine.tool_prompt import forced_call, strict_calls
from mlx_paged.sampling.sampling_params import SamplingParams
from mlx_paged.server.protocol import ParsedRequest
from mlx_paged.server.request_fields import MAX_TOKENS_LIMIT, NUMBER, err, typed
from mlx_paged.structured.grammars import check_grammar, json_schema_grammar

TOOL_CHOICES = ("auto", "any", "tool", "none")


def parse_messages(body: dict, tokenizer, defaults: dict) -> ParsedRequest:
    """Validate a `/v1/messages` body and render its prompt with the chat template."""
    _check_unsupported(body)
    messages, tools, kwargs = conversation(body)
    ids = render_chat(tokenizer, messages, tools, kwargs)
    grammar = _output_format(body, tokenizer)
    choice = body.get("tool_choice") or {}
    if choice.get("type") in ("any", "tool"):
        forced, after = forced_call(tokenizer, tools, choice.get("name"), "tool_choice"), []
    else:
        forced, after = strict_calls(tokenizer, tools, "tools") or (None, [])
    if forced is not None and grammar is not None:
        raise err("output_config.format and a forced or strict tool call cannot both shape "
                  "one answer", "tool_choice")  # fmt: skip
    grammar = forced or grammar
    params = SamplingParams(
        max_tokens=_max_tokens(body),
        temperature=typed(body, "temperature", NUMBER, defaults["temperature"], label="a number"),
        top_p=typed(body, "top_p", NUMBER, defaults["top_p"], label="a number"),
        top_k=typed(body, "top_k", int, defaults["top_k"], label="an integer"),
        min_p=defaults["min_p"],
        stop=_stop_sequences(body),
        grammar=grammar,
        grammar_after=after,
        speculate=typed(body, "speculate", bool, True, label="a boolean"),
    )
    stream = typed(body, "stream", bool, False, label="a boolean")
    model = typed(body, "model", str, None, label="a string")
    return ParsedRequest("messages", model, ids, params, True, stream, tools=tools)


def count_tokens(body: dict, tokenizer) -> dict:
    """`/v1/messages/count_tokens`: the prompt tokens `parse_messages` would send."""
    _check_unsupported(body)
    messages, tools, kwargs = conversation(body)
    return {"input_tokens": len(render_chat(tokenizer, messages, tools, kwargs))}


def conversation(body: dict) -> tuple[list[dict], list | None, dict]:
    """The chat template's messages (OpenAI's form: `chat_messages`), function tools and
    template variables of a Messages `body`."""
    messages = [*_system(body), *_messages(body.get("messages"))]
    tools = _tools(body)
    choice = _tool_choice(body)
    if choice == "none":
        tools = None  # the template does not offer them, so the model does not call them
    return chat_messages(messages), tools, _thinking(body)


def _output_format(body: dict, tokenizer) -> str | None:
    """The grammar of `output_config.format` (Anthropic's structured outputs), else None."""
    config = body.get("output_config")
    if config is None:
        return None
    fmt = config.get("format") if isinstance(config, dict) else "bad"
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
        raise err("output_config.format must be {'type': 'json_schema', 'schema': {...}}",
                  "output_config")  # fmt: skip
    grammar = json_schema_grammar(fmt["schema"], "output_config")
    check_grammar(grammar, tokenizer._tokenizer, "output_config")
    return grammar


def _check_unsupported(body: dict) -> None:
    for name in ("container", "mcp_servers", "context_management"):
        if body.get(name) is not None:
            raise err(f"{name}: this parameter is not supported", name)


def _max_tokens(body: dict) -> int:
    value = body.get("max_tokens")
    if value is None:
        raise err("max_tokens is required", "max_tokens")
    if isinstance(value, bool) or not isinstance(value, int):
        raise err("max_tokens must be an integer", "max_tokens")
    if not 1 <= value <= MAX_TOKENS_LIMIT:
        raise err(f"max_tokens must be 1 to {MAX_TOKENS_LIMIT:,}, got {value}", "max_tokens")
    return value


def _stop_sequences(body: dict) -> list[str]:
    stops = body.get("stop_sequences")
    if stops is None:
        return []
    if not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise err("stop_sequences must be a list of strings", "stop_sequences")
    return stops


def _system(body: dict) -> list[dict]:
    system = body.get("system")
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        return [{"role": "system", "content": "".join(_texts(system, "system"))}]
    raise err("system must be a string or a list of text blocks", "system")


def _texts(blocks: list, where: str) -> list[str]:
    """The text of a list of text blocks (`system`, a tool result's content)."""
    texts = []
    for block in blocks:
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise err(f"{where}: a {kind!r} block is not supported here; send text", where)
        if not isinstance(block.get("text"), str):
            raise err(f"{where}: a text block needs a string 'text'", where)
        texts.append(block["text"])
    return texts


def _messages(messages) -> list[dict]:
    """Anthropic's turns as OpenAI-style messages: a tool result is a `tool` message, a
    `tool_use` block an assistant tool call."""
    if not isinstance(messages, list) or not messages:
        raise err("messages must be a non-empty list", "messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise err(f"messages[{i}]: role must be 'user' or 'assistant'", "messages")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": message["role"], "content": content})
        elif isinstance(content, list):
            out += _blocks(message["role"], content, i)
        else:
            raise err(f"messages[{i}].content must be a string or a list of blocks", "messages")
    return out


def _blocks(role: str, blocks: list, i: int) -> list[dict]:
    texts, calls, results = [], [], []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_call(block, i))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, i))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # earlier reasoning is not fed back, as chat templates drop it
        elif kind in ("image", "document"):
            raise err(f"messages[{i}]: {kind} blocks need a model that reads them; this "
                      f"model reads text only", "messages")  # fmt: skip
        else:
            raise err(f"messages[{i}]: a {kind!r} block is not supported in {role} turns",
                      "messages")  # fmt: skip
    if role == "assistant":
        return [
            {"role": role, "content": "".join(texts), **({"tool_calls": calls} if calls else {})}
        ]
    turn = [{"role": "user", "content": "".join(texts)}] if texts else []
    return results + turn


def _tool_call(block: dict, i: int) -> dict:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(arguments, dict):
        raise err(f"messages[{i}]: a tool_use block needs a string id and name and an "
                  f"object input", "messages")  # fmt: skip
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict, i: int) -> dict:
    call_id, content = block.get("tool_use_id"), block.get("content", "")
    if not isinstance(call_id, str):
        raise err(f"messages[{i}]: a tool_result block needs a string tool_use_id", "messages")
    if isinstance(content, list):
        content = "".join(_texts(content, "messages"))
    elif not isinstance(content, str):
        raise err(f"messages[{i}]: a tool_result's content must be text", "messages")
    if block.get("is_error"):
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tools(body: dict) -> list | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise err("tools must be a list of tool objects", "tools")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise err(f"tools[{j}]: {kind!r} tools run on Anthropic's servers; this server "
                      f"takes custom tools (name, description, input_schema)", "tools")  # fmt: skip
        schema = tool.get("input_schema")
        if not isinstance(tool.get("name"), str) or not isinstance(schema, dict):
            raise err(f"tools[{j}] needs a string name and an object input_schema", "tools")
        function = {"name": tool["name"], "parameters": schema}
        if tool.get("strict") is True:
            function["strict"] = True
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out or None


def _tool_choice(body: dict) -> str:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto"
    if not isinstance(choice, dict) or choice.get("type") not in TOOL_CHOICES:
        raise err(f"tool_choice must be an object whose type is one of {TOOL_CHOICES}",
                  "tool_choice")  # fmt: skip
    if choice["type"] == "tool" and not isinstance(choice.get("name"), str):
        raise err("tool_choice of type 'tool' needs the tool's name", "tool_choice")
    return choice["type"]


def _thinking(body: dict) -> dict:
    """Anthropic's `thinking` as the template variable reasoning templates read."""
    thinking = body.get("thinking")
    if thinking is None:
        return {}
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
        raise err("thinking must be {'type': 'enabled', ...} or {'type': 'disabled'}", "thinking")
    return {"enable_thinking": thinking["type"] == "enabled"}
