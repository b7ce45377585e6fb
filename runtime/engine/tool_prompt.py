"""Tools for every chat model, and tool calls that must happen.

A chat template without tool support gets the tool definitions in its system turn, in one
format: a call is `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format of
mlx-lm's `json_tools` parser (Hermes, Qwen), so calls come back through the same extractor.
Past calls are written into the assistant turns in that format, and tool results become user
turns that name the call they answer.

A forced call (`tool_choice` required or named, Anthropic's `any` or `tool`) is a grammar over
that format (`forced_call_grammar`), for templates that call tools in it or have none.
"""

from __future__ import annotations

import json

import llguidance
from mlx_lm.tool_parsers import json_tools

from mlx_paged.errors import InvalidRequestError
from mlx_paged.structured.grammars import COMPACT, check_grammar

TOOL_CALL_START, TOOL_CALL_END = json_tools.tool_call_start, json_tools.tool_call_end
INSTRUCTIONS = (
    "You can call the tools below. To call one, answer with only\n"
    f'{TOOL_CALL_START}{{"name": <the tool\'s name>, "arguments": <its arguments as a JSON '
    f"object>}}{TOOL_CALL_END}\nand its result will come back in the next message. Tools:"
)


def with_tool_prompt(messages: list[dict], tools: list[dict]) -> list[dict]:
    """`messages` (validated, OpenAI's form) for a template without tools: the tools in the
    system turn, calls and results as text."""
    lines = [json.dumps(t.get("function", t), ensure_ascii=False) for t in tools]
    prompt = "\n".join([INSTRUCTIONS, *lines])
    out = []
    for m in messages:
        if m["role"] == "tool":
            answer = m.get("tool_call_id") or m.get("name") or "a tool call"
            out.append({"role": "user", "content": f"Result of {answer}: {m['content']}"})
        elif m.get("tool_calls"):
            calls = "".join(_call_text(c) for c in m["tool_calls"])
            out.append({"role": m["role"], "content": (m["content"] or "") + calls})
        else:
            out.append(m)
    if out and out[0]["role"] in ("system", "developer"):
        return [{**out[0], "content": f"{out[0]['content']}\n\n{prompt}"}, *out[1:]]
    return [{"role": "system", "content": prompt}, *out]


def _call_text(call: dict) -> str:
    function = call["function"]
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return f"{TOOL_CALL_START}{json.dumps(body, ensure_ascii=False)}{TOOL_CALL_END}"


def parse_tool_call(text: str, tools=None) -> dict:
    """A call written in the default format (the text between the markers)."""
    return json.loads(text.strip())


def forced_call_grammar(
    tools: list[dict], name: str | None, param: str, opened: bool = False, strict_only=False
) -> str:
    """The grammar of exactly one call, in the default format, of the tool `name` (any of
    `tools` when None), whose arguments validate against its parameters (`strict_only`: only
    a strict tool's; the others' are any object); `opened`: the call's opening marker is
    already out."""
    named = all(
        isinstance(t, dict) and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str) for t in tools
    )  # fmt: skip
    if not named:
        raise InvalidRequestError("tools must be function tools with names", param="tools")
    functions = {t["function"]["name"]: t["function"] for t in tools}
    if name is not None and name not in functions:
        raise InvalidRequestError(f"{param}: no tool named {name!r} among tools", param=param)
    chosen = [functions[name]] if name is not None else list(functions.values())
    if not chosen:
        raise InvalidRequestError(f"{param}: a forced tool call needs tools", param=param)

    def arguments(f: dict) -> dict:  # a non-strict tool's, with `strict_only`: any object
        constrained = f.get("strict") or not strict_only
        return (f.get("parameters") if constrained else None) or {"type": "object"}

    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": f["name"]}, "arguments": arguments(f)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in chosen
    ]  # fmt: skip
    schema = {"x-guidance": COMPACT, **(calls[0] if len(calls) == 1 else {"anyOf": calls})}
    opening = "" if opened else json.dumps(TOOL_CALL_START)
    lark = f"start: {opening} call {json.dumps(TOOL_CALL_END)}\n"
    return llguidance.LLMatcher.grammar_from_lark(lark + f"call: %json {json.dumps(schema)}")


def calls_in_default_format(tokenizer) -> bool:
    """Whether the model's calls take the default format: its template has no tools (it gets
    `with_tool_prompt`), or calls them as mlx-lm's `json_tools` parser reads."""
    return not tokenizer.has_tool_calling or (
        tokenizer.tool_call_start == TOOL_CALL_START
        and tokenizer.tool_parser is json_tools.parse_tool_call
    )


def strict_calls(tokenizer, tools: list | None, param: str) -> tuple[str, list[int]] | None:
    """For `tool_choice` auto with strict tools (`"strict": true`): the grammar of the call
    that follows the opening marker, and the marker's token id, after which it starts (the
    text before is free; the answer ends with the call). None without strict tools; a 400
    naming `param` where calls take another format or the marker is not one token."""
    if not isinstance(tools, list):  # no tools, or bad ones that rendering refuses with a 400
        return None
    strict = [t for t in tools if isinstance(t, dict)
              and isinstance(t.get("function"), dict) and t["function"].get("strict")]  # fmt: skip
    if not strict:
        return None
    opening = tokenizer.encode(TOOL_CALL_START, add_special_tokens=False)
    if not calls_in_default_format(tokenizer) or len(opening) != 1:
        raise InvalidRequestError(
            f"{param}: a strict tool's input validates here when the call is forced, or, with "
            f"'auto', on models whose template opens a call with one {TOOL_CALL_START} token; "
            f"this one does not: force the call or drop 'strict'",
            param=param,
        )
    grammar = forced_call_grammar(tools, None, param, opened=True, strict_only=True)
    check_grammar(grammar, tokenizer._tokenizer, param)
    return grammar, opening


def forced_call(tokenizer, tools: list | None, name: str | None, param: str) -> str:
    """The checked grammar of a forced call (`forced_call_grammar`) for this model; a 400
    naming `param` where its calls take another format, or there are no tools."""
    if not tools or not isinstance(tools, list):
        raise InvalidRequestError(f"{param}: a forced tool call needs tools", param=param)
    if not calls_in_default_format(tokenizer):
        raise InvalidRequestError(
            f"{param}: this model's chat template calls tools in a format other than "
            f"{TOOL_CALL_START}JSON{TOOL_CALL_END}, which a call cannot be forced in yet; "
            f"use 'auto'",
            param=param,
        )
    grammar = forced_call_grammar(tools, name, param)
    check_grammar(grammar, tokenizer._tokenizer, param)
    return grammar
