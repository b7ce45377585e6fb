"""Tools for templates without them: the system turn lists them, past calls and results are
text in one format; a forced call's grammar takes exactly one valid call."""

from __future__ import annotations

import json

import llguidance
import pytest

from mlx_paged.engine.tool_prompt import (
    INSTRUCTIONS,
    TOOL_CALL_START,
    forced_call_grammar,
    parse_tool_call,
    strict_calls,
    with_tool_prompt,
)
from mlx_paged.errors import InvalidRequestError
from mlx_paged.structured.grammars import ll_tokenizer

WEATHER = {"name": "weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]}}  # fmt: skip
TIME = {"name": "time", "parameters": {"type": "object"}}
TOOLS = [{"type": "function", "function": WEATHER}, {"type": "function", "function": TIME}]


def test_the_system_turn_lists_the_tools_and_history_is_text():
    call = {"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Paris"}}}  # fmt: skip
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    out = with_tool_prompt(messages, TOOLS)
    tool_lines = "\n".join(json.dumps(t["function"]) for t in TOOLS)
    assert out[0] == {"role": "system", "content": f"Be brief.\n\n{INSTRUCTIONS}\n{tool_lines}"}
    assert out[1] == messages[1]
    written = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert out[2] == {"role": "assistant", "content": written}
    assert out[3] == {"role": "user", "content": "Result of c1: sunny"}
    assert parse_tool_call(written[len("<tool_call>") : -len("</tool_call>")]) == {
        "name": "weather", "arguments": {"city": "Paris"}}  # fmt: skip
    no_system = with_tool_prompt(messages[1:2], TOOLS)
    assert no_system[0]["role"] == "system" and no_system[1:] == messages[1:2]


def _accepts(grammar: str, tokenizer, text: str) -> bool:
    matcher = llguidance.LLMatcher(ll_tokenizer(tokenizer._tokenizer), grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()


def test_a_forced_call_grammar_takes_one_valid_call(tiny_tokenizer):
    named = forced_call_grammar(TOOLS, "weather", "tool_choice")
    good = '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>'
    assert _accepts(named, tiny_tokenizer, good)
    for bad in (
        '<tool_call>{"name": "time", "arguments": {}}</tool_call>',  # another tool
        '<tool_call>{"name": "weather", "arguments": {}}</tool_call>',  # city missing
        "Sure! " + good,  # text first
        good + good,  # two calls
    ):
        assert not _accepts(named, tiny_tokenizer, bad), bad
    anyone = forced_call_grammar(TOOLS, None, "tool_choice")
    assert _accepts(
        anyone, tiny_tokenizer, '<tool_call>{"name": "time", "arguments": {}}</tool_call>'
    )


@pytest.mark.parametrize(
    ("tools", "name", "says"),
    [(TOOLS, "nope", "no tool named 'nope'"), ([], None, "needs tools"),
     ([{"type": "function"}], None, "function tools with names")],
)  # fmt: skip
def test_forced_calls_that_cannot_be_made_are_400s(tools, name, says):
    with pytest.raises(InvalidRequestError, match=says) as info:
        forced_call_grammar(tools, name, "tool_choice")
    assert info.value.status == 400


def _strict(tools):
    return [{"type": "function", "function": {**t["function"], "strict": True}}
            if t["function"]["name"] == "weather" else t for t in tools]  # fmt: skip


def test_strict_tools_under_auto_constrain_the_call_after_a_one_token_marker(tiny_model_dir):
    """The grammar starts after the opening marker's token: only the strict tool's arguments
    must validate, the answer ends with the call."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tokenizer = load_tokenizer(tiny_model_dir("llama"))
    assert strict_calls(tokenizer, TOOLS, "tools") is None  # no strict tool: free
    assert strict_calls(tokenizer, 1, "tools") is None  # refused when the prompt renders
    with pytest.raises(InvalidRequestError, match="force the call or drop 'strict'"):
        strict_calls(tokenizer, _strict(TOOLS), "tools")  # the marker is several tokens here
    tokenizer._tokenizer.add_special_tokens({"additional_special_tokens": [TOOL_CALL_START]})
    grammar, after = strict_calls(tokenizer, _strict(TOOLS), "tools")
    assert after == tokenizer.encode(TOOL_CALL_START, add_special_tokens=False)
    ll = ll_tokenizer(tokenizer._tokenizer)
    ok = ['{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>',
          '{"name": "time", "arguments": {"any": 1}}</tool_call>']  # fmt: skip
    bad = ['{"name": "weather", "arguments": {"town": "Oslo"}}</tool_call>',
           '{"name": "time", "arguments": {}}</tool_call> and more']  # fmt: skip
    for text, fits in [(t, True) for t in ok] + [(t, False) for t in bad]:
        matcher = llguidance.LLMatcher(ll, grammar)
        ids = tokenizer._tokenizer.encode(text, add_special_tokens=False)
        consumed = all(matcher.consume_token(t) for t in ids)
        assert (consumed and matcher.is_accepting()) == fits, text
