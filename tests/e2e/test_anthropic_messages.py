"""Anthropic's Messages API through the official `anthropic` client, against the real server
on the embedded SmolLM2: whole and streamed messages, stop reasons, usage and the prefix cache,
token counts, tool-use history, and Anthropic-shaped refusals."""

from __future__ import annotations

import json
import urllib.request

import pytest

GREEDY = {"temperature": 0}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def claude(server):
    from anthropic import Anthropic

    return Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _create(claude, **kwargs):
    kwargs.setdefault("model", "default")
    kwargs.setdefault("max_tokens", 16)
    kwargs.setdefault("messages", FRANCE)
    return claude.messages.create(**kwargs, extra_body=GREEDY)


def test_a_whole_message(claude, server):
    reply = _create(claude, system="You answer in one sentence.")
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert reply.model == "SmolLM2-135M-Instruct"
    assert [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text == "The capital of France is Paris."
    assert reply.stop_reason == "end_turn" and reply.stop_sequence is None
    usage = reply.usage
    assert usage.output_tokens == 8  # seven text tokens and the end of turn
    counted = claude.messages.count_tokens(
        model="default", system="You answer in one sentence.", messages=FRANCE
    )
    assert usage.input_tokens + usage.cache_read_input_tokens == counted.input_tokens


def test_the_stream_assembles_the_whole_message(claude):
    """The `anthropic` client's stream helper builds the message `create` returns; the events
    come in Anthropic's order."""
    ask = dict(model="default", max_tokens=24, messages=FRANCE, system="Answer at length.")
    whole = claude.messages.create(**ask, extra_body=GREEDY)
    with claude.messages.stream(**ask, extra_body=GREEDY) as stream:
        kinds = [event.type for event in stream if event.type != "text"]
        streamed = stream.get_final_message()
    assert [b.text for b in streamed.content] == [b.text for b in whole.content]
    assert streamed.stop_reason == whole.stop_reason == "max_tokens"
    assert streamed.usage.output_tokens == whole.usage.output_tokens == 24
    total = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert streamed.usage.input_tokens + streamed.usage.cache_read_input_tokens == total
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}


def test_a_stop_sequence_ends_the_message_and_is_named(claude):
    reply = _create(claude, stop_sequences=["Paris", "Berlin"])
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "Paris"
    assert reply.content[0].text == "The capital of France is "


def test_a_repeated_request_reads_its_prompt_from_the_prefix_cache(claude):
    system = "You are a geography teacher. " * 8  # a few blocks of 16 tokens
    first = _create(claude, system=system)
    second = _create(claude, system=system)
    total = first.usage.input_tokens + first.usage.cache_read_input_tokens
    assert second.usage.cache_read_input_tokens >= 16
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total
    assert second.content[0].text == first.content[0].text


def test_system_blocks_tool_use_and_tool_results_render(claude):
    blocks = [{"type": "text", "text": "You answer in one sentence."}]
    as_blocks = _create(claude, system=blocks)
    as_text = _create(claude, system="You answer in one sentence.")
    assert as_blocks.content[0].text == as_text.content[0].text
    history = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny, 21 C"},
            {"type": "text", "text": "And so?"},
        ]},
    ]  # fmt: skip
    reply = _create(claude, messages=history)
    assert reply.content[0].text and reply.stop_reason in ("end_turn", "max_tokens")


def _raw_post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url + "/v1/messages", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"max_tokens": None}, 400, "max_tokens is required"),
        ({"model": "claude-opus"}, 404, "is not served here"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "reads text only",
        ),  # fmt: skip
        ({"tool_choice": {"type": "any"}}, 400, "a forced tool call needs tools"),
        (
            {"output_config": {"format": {"type": "json_schema", "schema": {"type": "x"}}}},
            400,
            "cannot constrain output",
        ),  # fmt: skip
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "run on Anthropic's servers",
        ),  # fmt: skip
        ({"messages": [{"role": "system", "content": "hi"}]}, 400, "'user' or 'assistant'"),
        ({"stop_sequences": "Paris"}, 400, "list of strings"),
    ],
    ids=[
        "no_max_tokens",
        "model",
        "image",
        "tool_choice_any_without_tools",
        "bad_output_schema",
        "server_tool",
        "role",
        "stop_sequences",
    ],  # fmt: skip
)
def test_bad_requests_get_anthropic_errors(server, change, status, says):
    body = {"model": "default", "max_tokens": 8, "messages": FRANCE}
    body = {k: v for k, v in {**body, **change}.items() if v is not None}
    got_status, reply = _raw_post(server.url, body)
    kind = {400: "invalid_request_error", 404: "not_found_error"}[status]
    assert got_status == status and reply["type"] == "error"
    assert reply["error"]["type"] == kind and says in reply["error"]["message"]


def test_the_client_raises_its_own_errors(claude):
    from anthropic import BadRequestError, NotFoundError

    with pytest.raises(NotFoundError):
        claude.messages.create(model="claude-opus", max_tokens=8, messages=FRANCE)
    with pytest.raises(BadRequestError, match="text only"):
        claude.messages.create(
            model="default",
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": "iVBORw0KGgo=",
                            },
                        },
                    ],
                }
            ],  # fmt: skip
        )
