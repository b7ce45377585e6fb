"""Property-based fuzz of the real server: random JSON bodies around the API's own fields, random
headers and raw request lines. Every reply must be a well-formed HTTP response, a completion or
an OpenAI-shaped error with a status that matches it, and the server must stay healthy."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from raw_http import exchange, parse_reply, post_bytes
from server_process import start_server

pytestmark = pytest.mark.e2e

# A longer or freshly random run: MLX_PAGED_FUZZ_EXAMPLES=2000 MLX_PAGED_FUZZ_RANDOM=1.
EXAMPLES = int(os.environ.get("MLX_PAGED_FUZZ_EXAMPLES", "150"))
FIELDS = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "stop",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "logit_bias",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "response_format",
    "xtc_probability",
    "xtc_threshold",
    "echo",
    "best_of",
]
PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/chat/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/nope",
]
STATUSES = {200, 400, 401, 404, 405, 408, 411, 413, 414, 431, 501, 503, 505}

numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, -1, 0.5, 10**19, 2**31, 2**64]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    st.text(max_size=20),
    st.sampled_from(["\ud800", "", "user", "text", "function"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool", "robot"])},
        optional={
            "content": st.one_of(st.text(max_size=30), json_values),
            "tool_calls": json_values,
            "name": json_values,
        },
    ),
    max_size=3,
)
# A valid request with up to three fields replaced, so most cases reach the engine.
VALID = (
    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    {"prompt": "Once upon a time", "max_tokens": 2},
    {},
)
field_values = st.one_of(
    json_values, numbers, messages, st.lists(st.integers(-5, 60000), max_size=5)
)
bodies = st.builds(
    lambda base, extra: {**base, **extra},
    st.sampled_from(VALID),
    st.dictionaries(st.sampled_from(FIELDS), field_values, max_size=3),
)
header_names = st.sampled_from(
    [
        "Content-Length",
        "Content-Type",
        "Authorization",
        "Transfer-Encoding",
        "Connection",
        "Expect",
        "X-Junk",
    ]
)
header_values = st.one_of(
    st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20),
    st.sampled_from(["-1", "0", "5", "+3", " 7", "chunked", "close"]),
)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, smollm2_dir):
    server = start_server(
        tmp_path_factory.mktemp("fuzz"),
        "--max-tokens",
        "2",
        "--request-timeout",
        "2",
        "--kv-budget",
        "64MB",
    )
    yield server
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log() and "unhandled error" not in server.log()


def check_reply(data: bytes) -> None:
    reply = parse_reply(data)
    assert reply.status in STATUSES, (reply.status, reply.body[:200])
    if reply.headers.get("content-type") == "application/json":
        payload = reply.json()
        if reply.status >= 400:
            assert set(payload["error"]) == {"message", "type", "param", "code"}
    elif reply.status != 200:
        raise AssertionError(f"{reply.status} without a JSON error: {reply.body[:200]!r}")


def assert_healthy(srv) -> None:
    with urllib.request.urlopen(srv.url + "/health", timeout=30) as r:
        assert json.load(r) == {"status": "ok"}


settings.register_profile(
    "server",
    deadline=None,
    derandomize=os.environ.get("MLX_PAGED_FUZZ_RANDOM") != "1",
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@settings(settings.get_profile("server"), max_examples=EXAMPLES)
@given(body=bodies, path=st.sampled_from(PATHS[:3]))
def test_random_bodies_get_a_completion_or_a_shaped_error(srv, body, path):
    if "prompt" in body and "messages" not in body:
        path = "/v1/completions"
    raw = json.dumps(body, allow_nan=True).encode()
    check_reply(exchange(srv.url, post_bytes(path, raw), timeout=60))


@settings(settings.get_profile("server"), max_examples=EXAMPLES)
@given(
    headers=st.lists(st.tuples(header_names, header_values), max_size=5),
    method=st.sampled_from(["GET", "POST", "PUT", "HEAD", "OPTIONS", "BREW", "DELETE"]),
    path=st.sampled_from(PATHS),
    body=st.binary(max_size=40),
)
def test_random_headers_and_methods_get_a_shaped_reply(srv, headers, method, path, body):
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    data = f"{method} {path} HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body
    reply = exchange(srv.url, data, timeout=30, half_close=True)
    if not reply:
        return
    if method in ("HEAD", "OPTIONS"):  # no body to check beyond a parseable status
        assert parse_reply(reply).status in STATUSES | {204}
    else:
        check_reply(reply)


@settings(settings.get_profile("server"), max_examples=EXAMPLES // 3)
@given(line=st.binary(max_size=60))
def test_random_request_lines_get_a_shaped_reply_or_a_close(srv, line):
    reply = exchange(srv.url, line.replace(b"\n", b" ") + b"\r\n\r\n", timeout=30, half_close=True)
    if reply:
        check_reply(reply)


def test_the_server_is_healthy_after_the_fuzz(srv):
    assert_healthy(srv)
