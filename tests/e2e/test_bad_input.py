"""Every bad request gets OpenAI's error shape with a 4xx status, and the server keeps serving."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import sys

import pytest

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
MSG = [{"role": "user", "content": "Say hi."}]


def post(server, path: str, body, headers=None, raw: bytes | None = None):
    host, port = server.url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    data = raw if raw is not None else json.dumps(body).encode()
    conn.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    payload = resp.read()
    conn.close()
    return resp.status, json.loads(payload) if payload else None


def assert_error(status, payload, expected_status, param=None, fragment=None):
    assert status == expected_status, payload
    err = payload["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if fragment is not None:
        assert fragment in err["message"], err


CHAT_CASES = [
    ("malformed JSON", None, b'{"messages": [', 400, None, "not valid JSON"),
    ("not an object", None, b"[]", 400, None, "JSON object"),
    ("missing messages", {"model": MODEL}, None, 400, "messages", "required"),
    ("messages wrong type", {"messages": "hi"}, None, 400, "messages", None),
    ("bad role", {"messages": [{"role": "robot", "content": "x"}]}, None, 400, "messages", None),
    (
        "temperature wrong type",
        {"messages": MSG, "temperature": "warm"},
        None,
        400,
        "temperature",
        "number",
    ),
    ("max_tokens zero", {"messages": MSG, "max_tokens": 0}, None, 400, "max_tokens", None),
    ("max_tokens negative", {"messages": MSG, "max_tokens": -1}, None, 400, "max_tokens", None),
    ("max_tokens absurd", {"messages": MSG, "max_tokens": 10**12}, None, 400, "max_tokens", None),
    (
        "max_tokens beyond context",
        {"messages": MSG, "max_tokens": 8190},
        None,
        400,
        "max_tokens",
        "context",
    ),
    ("n > 1", {"messages": MSG, "n": 3}, None, 400, "n", None),
    (
        "unknown response format",
        {"messages": MSG, "response_format": {"type": "grammar"}},
        None,
        400,
        "response_format",
        None,
    ),
    (
        "forced call of a tool that is not offered",
        {
            "messages": MSG,
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}},
        },
        None,
        400,
        "tool_choice",
        "no tool named 'g'",
    ),
    (
        "image content",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        None,
        400,
        "messages",
        None,
    ),
    (
        "top_logprobs without logprobs",
        {"messages": MSG, "top_logprobs": 2},
        None,
        400,
        "top_logprobs",
        None,
    ),
    (
        "5000-digit max_tokens",
        None,
        b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}",
        400,
        None,
        "more than 4300 digits",
    ),
    (
        "5000-digit unknown field",
        None,
        b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"1" * 5000 + b"}",
        400,
        None,
        "more than 4300 digits",
    ),
    (
        "logit_bias outside vocabulary",
        {"messages": MSG, "logit_bias": {"999999": 1}},
        None,
        400,
        "logit_bias",
        "vocabulary",
    ),
]


@pytest.mark.parametrize(
    "name,body,raw,status,param,fragment", CHAT_CASES, ids=[c[0] for c in CHAT_CASES]
)
def test_chat_bad_input(server, name, body, raw, status, param, fragment):
    s, payload = post(server, "/v1/chat/completions", body, raw=raw)
    assert_error(s, payload, status, param, fragment)


def test_unknown_model_is_404(server):
    s, payload = post(server, "/v1/chat/completions", {"model": "gpt-7", "messages": MSG})
    assert_error(s, payload, 404, "model", "gpt-7")
    assert payload["error"]["code"] == "model_not_found"


def test_prompt_longer_than_context(server):
    s, payload = post(server, "/v1/completions", {"model": MODEL, "prompt": "hello " * 9000})
    assert_error(s, payload, 400, None, "context")
    assert payload["error"]["code"] == "context_length_exceeded"


def test_completion_bad_prompt(server):
    s, payload = post(server, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert_error(s, payload, 400, "prompt")
    s, payload = post(server, "/v1/completions", {"model": MODEL, "prompt": [1, 10**9]})
    assert_error(s, payload, 400, "prompt", "token ids")


def test_oversized_body_is_413(server):
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (5 * 1024 * 1024)}]})
    s, payload = post(server, "/v1/chat/completions", None, raw=big.encode())
    assert_error(s, payload, 413, None, "--max-request-bytes")


def test_missing_content_length_is_411(server):
    host, port = server.url[len("http://") :].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Type", "application/json")
    conn.endheaders()
    resp = conn.getresponse()
    assert_error(resp.status, json.loads(resp.read()), 411, None, "Content-Length")
    conn.close()


def test_unknown_route_is_404(server):
    s, payload = post(server, "/v1/embeddings", {"input": "x"})
    assert_error(s, payload, 404, None, "no route")


def test_server_still_serves_after_bad_requests(client):
    r = client.chat.completions.create(
        model=MODEL,
        max_tokens=8,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in r.choices[0].message.content


def test_openai_client_surfaces_the_error(client):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=0)
    assert "max_tokens" in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_returns_after_large_bodies_parsed_at_once(server):
    """Twenty 4 MB bodies of small integers at a time (their objects take ten times their
    bytes), twice: the front process ends near where it started (it kept about 300 MiB when
    they were parsed at once in glibc's heaps)."""
    body = {"model": "nope", "messages": MSG, "pad": list(range(10**6, 10**6 + 440_000))}
    raw = json.dumps(body).encode()
    assert 3_900_000 < len(raw) < 4 * 2**20

    def rss() -> int:
        with open(f"/proc/{server.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) * 1024

    before = rss()
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        for _ in range(2):
            replies = list(
                pool.map(lambda _: post(server, "/v1/chat/completions", None, raw=raw), range(20))
            )
            assert {status for status, _ in replies} <= {404, 503}  # served, or over the budget
    grown = rss() - before
    assert grown < 96 * 2**20, f"the front process kept {grown / 2**20:.0f} MiB"
