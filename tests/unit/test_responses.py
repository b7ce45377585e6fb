"""Response shapes and SSE framing."""

import json

from mlx_paged.engine.outputs import TokenLogprob
from mlx_paged.server.responses import SSE_DONE, ResponseBuilder, sse_event, usage


def test_sse_event_framing():
    assert sse_event({"a": 1, "b": "é"}) == 'data: {"a": 1, "b": "é"}\n\n'.encode()
    assert SSE_DONE == b"data: [DONE]\n\n"


def test_usage_shape():
    assert usage(10, 3, 4) == {
        "prompt_tokens": 10,
        "completion_tokens": 3,
        "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_chat_stream_chunks():
    b = ResponseBuilder("chat", "m")
    first = b.chunk(role=True)
    assert first["object"] == "chat.completion.chunk" and first["id"].startswith("chatcmpl-")
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    assert b.chunk(text="Hi")["choices"][0]["delta"] == {"content": "Hi"}
    assert b.chunk(finish_reason="stop")["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert b.usage_chunk(usage(1, 2))["choices"] == []
    assert len({b.chunk()["id"], first["id"]}) == 1


def test_chat_full_with_logprobs_and_tool_calls():
    b = ResponseBuilder("chat", "m")
    lp = [
        TokenLogprob(5, "Hi", -0.5, [(5, "Hi", -0.5), (6, "Yo", -1.0)]),
        TokenLogprob(7, "!", float("-inf"), []),
    ]
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    body = b.full(
        text="Hi!",
        tool_calls=[call],
        logprobs=lp,
        want_logprobs=True,
        finish_reason="tool_calls",
        usage_body=usage(3, 2),
    )
    choice = body["choices"][0]
    assert body["object"] == "chat.completion"
    assert choice["message"]["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert choice["logprobs"]["content"][0] == {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [
            {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
            {"token": "Yo", "logprob": -1.0, "bytes": [89, 111]},
        ],
    }
    assert choice["logprobs"]["content"][1]["logprob"] == -9999.0
    json.dumps(body, allow_nan=False)  # valid strict JSON


def test_completion_logprobs_offsets():
    b = ResponseBuilder("completion", "m")
    lp = [TokenLogprob(1, "ab", -0.1, [(1, "ab", -0.1)]), TokenLogprob(2, "c", -0.2, [])]
    body = b.full(
        text="abc",
        tool_calls=[],
        logprobs=lp,
        want_logprobs=True,
        finish_reason="length",
        usage_body=usage(1, 2),
    )
    assert body["object"] == "text_completion"
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["ab", "c"],
        "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"ab": -0.1}, {}],
        "text_offset": [0, 2],
    }
    assert body["choices"][0]["text"] == "abc"


def test_tokens_as_ids():
    b = ResponseBuilder("completion", "m", tokens_as_ids=True)
    lp = [TokenLogprob(17, "\ufffd", -0.1, [(17, "\ufffd", -0.1)])]
    body = b.full(
        text="x",
        tool_calls=[],
        logprobs=lp,
        want_logprobs=True,
        finish_reason="length",
        usage_body=usage(1, 1),
    )
    assert body["choices"][0]["logprobs"]["tokens"] == ["token_id:17"]
    assert body["choices"][0]["logprobs"]["top_logprobs"] == [{"token_id:17": -0.1}]
