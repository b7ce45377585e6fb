"""Tools on a model whose chat template has none (the embedded SmolLM2), through the real
server and both official clients: forced calls come back as one call whose arguments validate,
named or any, whole or streamed; `none` withdraws the tools."""

from __future__ import annotations

import json

import jsonschema
import pytest

CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
ZONE = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                      "parameters": CITY}},
    {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                      "parameters": ZONE}},
]  # fmt: skip
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {"get_weather": CITY, "get_time": ZONE}


def _one_valid_call(calls, name=None):
    assert len(calls) == 1
    function = calls[0].function
    assert name is None or function.name == name
    jsonschema.validate(json.loads(function.arguments), SCHEMAS[function.name])
    return function


def test_required_and_named_calls(client):
    reply = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.choices[0].message.content is None
    _one_valid_call(reply.choices[0].message.tool_calls)
    named = {"type": "function", "function": {"name": "get_time"}}
    reply = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice=named, max_tokens=60
    )
    _one_valid_call(reply.choices[0].message.tool_calls, "get_time")


def test_a_streamed_forced_call(client):
    stream = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=60,
        stream=True,
    )  # fmt: skip
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    _one_valid_call(calls)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_none_withdraws_the_tools(client):
    offered = dict(model="default", messages=ASK, max_tokens=16)
    plain = client.chat.completions.create(**offered).choices[0].message.content
    reply = client.chat.completions.create(**offered, tools=TOOLS, tool_choice="none")
    assert reply.choices[0].message.content == plain and not reply.choices[0].message.tool_calls


def test_anthropic_any_and_named_strict_tools(server):
    from anthropic import Anthropic

    claude = Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    tools = [
        {"name": f["name"], "description": f["description"], "input_schema": f["parameters"],
         "strict": True}
        for f in (t["function"] for t in TOOLS)
    ]  # fmt: skip
    ask = dict(model="default", max_tokens=60, messages=ASK, tools=tools)
    reply = claude.messages.create(**ask, tool_choice={"type": "any"})
    assert reply.stop_reason == "tool_use" and [b.type for b in reply.content] == ["tool_use"]
    jsonschema.validate(reply.content[0].input, SCHEMAS[reply.content[0].name])
    with claude.messages.stream(**ask, tool_choice={"type": "tool", "name": "get_time"}) as stream:
        message = stream.get_final_message()
    assert message.stop_reason == "tool_use" and message.content[0].name == "get_time"
    jsonschema.validate(message.content[0].input, ZONE)


def test_strict_tools_under_auto_need_a_one_token_call_marker(server, client):
    """SmolLM2's calls open with `<tool_call>` spelled in several tokens, which no grammar can
    wait for: a strict tool under `auto` is a 400 that says to force the call (and then it
    validates, as above)."""
    from anthropic import Anthropic, BadRequestError
    from openai import BadRequestError as OpenAIBadRequest

    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    with pytest.raises(OpenAIBadRequest, match="force the call or drop 'strict'"):
        client.chat.completions.create(model="default", messages=ASK, max_tokens=8, tools=strict)
    claude = Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "input_schema": CITY, "strict": True}
    with pytest.raises(BadRequestError, match="force the call or drop 'strict'"):
        claude.messages.create(model="default", max_tokens=8, messages=ASK, tools=[tool])
