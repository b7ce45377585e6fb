"""Anthropic Messages bodies to what the chat template takes: turns, tool calls and results,
tools, tool choice and thinking, exactly."""

from __future__ import annotations

import pytest

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.anthropic_request import conversation

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def turn(role: str, *blocks: dict) -> dict:
    return {"messages": [{"role": role, "content": list(blocks)}]}


def test_turns_tool_calls_and_results_become_openai_messages():
    body = {
        "system": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "look it up", "signature": "s"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather",
                 "input": {"city": "Paris"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1",
                 "content": [{"type": "text", "text": "sunny"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city",
                 "is_error": True},
                {"type": "text", "text": "So?"},
            ]},
        ],
    }  # fmt: skip
    messages, tools, kwargs = conversation(body)
    call = {"id": "toolu_1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Paris"}}}  # fmt: skip
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "toolu_1"},
        {"role": "tool", "content": "Error: no such city", "tool_call_id": "toolu_2"},
        {"role": "user", "content": "So?"},
    ]
    assert tools is None and kwargs == {}


def test_tools_become_function_tools_and_none_withdraws_them():
    tool = {"name": "weather", "description": "Weather now.", "input_schema": SCHEMA}
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    function = {"name": "weather", "parameters": SCHEMA, "description": "Weather now."}
    assert conversation(body)[1] == [{"type": "function", "function": function}]
    assert conversation({**body, "tool_choice": {"type": "auto"}})[1] is not None
    assert conversation({**body, "tool_choice": {"type": "none"}})[1] is None


@pytest.mark.parametrize(("thinking", "enabled"), [("enabled", True), ("disabled", False)])
def test_thinking_reaches_the_template(thinking, enabled):
    body = {"messages": [{"role": "user", "content": "hi"}], "thinking": {"type": thinking}}
    assert conversation(body)[2] == {"enable_thinking": enabled}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"system": 3}, "system must be"),
        ({"messages": []}, "non-empty list"),
        (turn("user", {"type": "tool_use"}), "not supported in user turns"),
        (turn("assistant", {"type": "tool_result"}), "in assistant turns"),
        (turn("assistant", {"type": "tool_use", "id": 1}), "string id"),
        ({"tools": [{"name": "t"}]}, "input_schema"),
        ({"tool_choice": {"type": "tool"}}, "needs the tool's name"),
        ({"tool_choice": "auto"}, "tool_choice must be an object"),
        ({"thinking": {"type": "adaptive"}}, "thinking must be"),
    ],
)  # fmt: skip
def test_bad_bodies_name_the_field(change, says):
    body = {"messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(InvalidRequestError, match=says) as info:
        conversation(body)
    assert info.value.status == 400 and info.value.param == next(iter(change))
