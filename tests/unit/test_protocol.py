"""Request validation: every bad input becomes an InvalidRequestError naming what to fix."""

import json

import pytest

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.protocol import parse_chat, parse_completion
from mlx_paged.server.request_body import parse_json_body

DEFAULTS = {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
MSG = [{"role": "user", "content": "hello"}]


def chat(tok, **body):
    return parse_chat({"messages": MSG, **body}, tok, DEFAULTS)


@pytest.mark.parametrize(
    "raw,fragment",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (b'{"max_tokens": ' + b"9" * 5000 + b"}", "an integer of more than 4300 digits"),
        (b'{"frobnicate": -' + b"1" * 5000 + b"}", "an integer of more than 4300 digits"),
        (b'{"a": [' + b"7" * 4400 + b"]}", "an integer of more than 4300 digits"),
    ],
)
def test_body_must_be_a_json_object(raw, fragment):
    with pytest.raises(InvalidRequestError) as info:
        parse_json_body(raw)
    assert fragment in info.value.message and info.value.status == 400


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -5}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"max_tokens": 10**9}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 2}, "n"),
        ({"stop": 5}, "stop"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logprobs": "yes"}, "logprobs"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"stream": "true"}, "stream"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": 1}}},
            "response_format",
        ),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": "f"}, "tools"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),  # and no tools
        ({"seed": "x"}, "seed"),
    ],
)
def test_chat_rejections_name_the_field(tiny_tokenizer, body, param):
    full = {"messages": MSG, **body}
    with pytest.raises(InvalidRequestError) as info:
        parse_chat(full, tiny_tokenizer, DEFAULTS)
    assert info.value.param == param, info.value.message
    assert info.value.status == 400


def test_chat_renders_the_template_and_defaults(tiny_tokenizer):
    req = chat(tiny_tokenizer, stream=True, stream_options={"include_usage": True}, stop="###")
    expected = tiny_tokenizer.apply_chat_template(MSG, add_generation_prompt=True)
    assert req.prompt_token_ids == list(expected)
    assert (req.stream, req.include_usage, req.max_tokens_explicit) == (True, True, False)
    assert req.params.max_tokens == 64 and req.params.stop == ["###"]


def test_max_completion_tokens_wins_over_max_tokens(tiny_tokenizer):
    req = chat(tiny_tokenizer, max_tokens=5, max_completion_tokens=9)
    assert req.params.max_tokens == 9 and req.max_tokens_explicit


def test_text_parts_are_joined(tiny_tokenizer):
    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    req = parse_chat({"messages": [{"role": "user", "content": parts}]}, tiny_tokenizer, DEFAULTS)
    assert req.prompt_token_ids == chat(tiny_tokenizer).prompt_token_ids


def test_chat_logprobs(tiny_tokenizer):
    req = chat(tiny_tokenizer, logprobs=True, top_logprobs=3)
    assert (req.logprobs, req.top_logprobs) == (True, 3)


def test_completion_prompt_forms(tiny_tokenizer):
    text = parse_completion({"prompt": "hello world"}, tiny_tokenizer, DEFAULTS)
    assert text.prompt_token_ids == list(tiny_tokenizer.encode("hello world"))
    ids = parse_completion({"prompt": [5, 6, 7], "logprobs": 2}, tiny_tokenizer, DEFAULTS)
    assert ids.prompt_token_ids == [5, 6, 7] and (ids.logprobs, ids.top_logprobs) == (True, 2)
    single = parse_completion({"prompt": ["hello world"]}, tiny_tokenizer, DEFAULTS)
    assert single.prompt_token_ids == text.prompt_token_ids


@pytest.mark.parametrize("prompt", [None, "", [], ["a", "b"], [1.5], {"x": 1}])
def test_completion_prompt_rejections(tiny_tokenizer, prompt):
    body = {} if prompt is None else {"prompt": prompt}
    with pytest.raises(InvalidRequestError) as info:
        parse_completion(body, tiny_tokenizer, DEFAULTS)
    assert info.value.param == "prompt"


def test_completion_rejects_echo_and_suffix(tiny_tokenizer):
    for field in ("echo", "suffix"):
        with pytest.raises(InvalidRequestError) as info:
            parse_completion(
                {"prompt": "x", field: True if field == "echo" else "tail"},
                tiny_tokenizer,
                DEFAULTS,
            )
        assert info.value.param == field


def test_assistant_tool_call_arguments_are_decoded_for_the_template(tiny_tokenizer):
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": json.dumps({"x": 1})},
    }
    body = {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "42", "tool_call_id": "c1"},
        ]
    }
    parse_chat(body, tiny_tokenizer, DEFAULTS)  # renders without raising
    bad = {**call, "function": {"name": "f", "arguments": "{oops"}}
    body["messages"][1]["tool_calls"] = [bad]
    with pytest.raises(InvalidRequestError):
        parse_chat(body, tiny_tokenizer, DEFAULTS)
