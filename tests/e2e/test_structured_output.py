"""Structured output through the real server and the official clients: `response_format` on
both OpenAI routes and `output_config.format` on Anthropic's give JSON that validates, streamed
or whole, beside free requests; schemas that cannot constrain output are 400s naming the
field."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "is_capital": {"type": "boolean"},
    },
    "required": ["city", "country", "is_capital"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Name the capital of France as JSON."}]
JSON_SCHEMA = {
    "type": "json_schema",
    "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
}


def _valid(text: str) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value


def test_chat_json_schema_whole_and_streamed(client):
    reply = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=80, response_format=JSON_SCHEMA
    )
    assert reply.choices[0].finish_reason == "stop"
    value = _valid(reply.choices[0].message.content)
    stream = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=80, response_format=JSON_SCHEMA, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert _valid(text) == value  # greedy: the same JSON either way


def test_json_object_mode_and_completions(client):
    reply = client.chat.completions.create(
        model="default", messages=ASK, max_tokens=80, response_format={"type": "json_object"}
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content), dict)
    else:
        assert reply.choices[0].message.content.startswith("{")
    completion = client.completions.create(
        model="default", prompt="The capital of France as JSON:", max_tokens=80,
        extra_body={"response_format": JSON_SCHEMA},
    )  # fmt: skip
    assert completion.choices[0].finish_reason == "stop"
    _valid(completion.choices[0].text)


def test_constrained_and_free_requests_share_the_batch(client):
    """Eight requests at once, every other one constrained: the constrained ones validate, the
    free ones answer as they do alone."""
    free = dict(model="default", messages=ASK, max_tokens=24)
    alone = client.chat.completions.create(**free).choices[0].message.content

    def ask(i: int):
        extra = {"response_format": JSON_SCHEMA, "max_tokens": 80} if i % 2 == 0 else {}
        return client.chat.completions.create(**{**free, **extra}).choices[0].message.content

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, range(8)))
    for i, answer in enumerate(answers):
        if i % 2 == 0:
            _valid(answer)
        else:
            assert answer == alone


def test_anthropic_output_format(server):
    from anthropic import Anthropic

    claude = Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    fmt = {"format": {"type": "json_schema", "schema": SCHEMA}}
    ask = dict(model="default", max_tokens=80, messages=ASK, extra_body={"output_config": fmt})
    reply = claude.messages.create(**ask)
    assert reply.stop_reason == "end_turn"
    value = _valid(reply.content[0].text)
    with claude.messages.stream(**ask) as stream:
        assert _valid(stream.get_final_message().content[0].text) == value


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectt"}}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}},
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "grammar"},
    ],
    ids=["bad_type", "bad_ref", "no_schema", "unknown_mode"],
)
def test_schemas_that_cannot_constrain_are_400s(client, fmt):
    from openai import BadRequestError

    with pytest.raises(BadRequestError) as info:
        client.chat.completions.create(model="default", messages=ASK, response_format=fmt)
    assert info.value.body["param"] == "response_format"
