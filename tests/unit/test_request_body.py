"""Content-Length rules, body reads and JSON checks, without a socket."""

from __future__ import annotations

import io
from email.message import Message

import pytest

from mlx_paged.errors import InvalidRequestError
from mlx_paged.server.request_body import (
    MAX_JSON_DEPTH,
    content_length,
    parse_json_body,
    read_exactly,
)


def headers(*pairs) -> Message:
    msg = Message()
    for name, value in pairs:
        msg[name] = value
    return msg


@pytest.mark.parametrize(
    "pairs,status,fragment",
    [
        ((), 411, "required"),
        ((("Content-Length", "-1"),), 400, "non-negative"),
        ((("Content-Length", "+5"),), 400, "non-negative"),
        ((("Content-Length", "1e3"),), 400, "non-negative"),
        ((("Content-Length", "٣"),), 400, "non-negative"),  # a digit, but not an ASCII one
        ((("Content-Length", "5"), ("Content-Length", "5")), 400, "more than one"),
        ((("Content-Length", "5"), ("Transfer-Encoding", "chunked")), 411, "Transfer-Encoding"),
        ((("Content-Length", "101"),), 413, "--max-request-bytes"),
    ],
)
def test_content_length_refusals(pairs, status, fragment):
    with pytest.raises(InvalidRequestError) as info:
        content_length(headers(*pairs), max_bytes=100)
    assert info.value.status == status and fragment in info.value.message


def test_content_length_accepts_a_plain_count():
    assert content_length(headers(("Content-Length", " 100 ")), max_bytes=100) == 100


def test_read_exactly_refuses_a_short_body_and_says_when_the_deadline_cut_it():
    assert read_exactly(io.BytesIO(b"abcdef").read, 4, lambda: None) == b"abcd"
    with pytest.raises(InvalidRequestError) as info:
        read_exactly(io.BytesIO(b"ab").read, 4, lambda: None)
    assert info.value.status == 400 and "after 2 of the 4 bytes" in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        read_exactly(io.BytesIO(b"ab").read, 4, lambda: "the request did not arrive within X")
    assert info.value.status == 408


@pytest.mark.parametrize(
    "raw,fragment",
    [
        (b"[" * 10_000 + b"]" * 10_000, "deeper than"),
        (b'{"a": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}", "deeper than"),
        (b'{"a": "\\udc00"}', "surrogate"),
        (b'{"\\ud800": 1}', "surrogate"),
        (b"\xff", "UTF-8"),
    ],
)
def test_json_bodies_that_could_hurt_are_refused(raw, fragment):
    with pytest.raises(InvalidRequestError) as info:
        parse_json_body(raw)
    assert fragment in info.value.message and info.value.status == 400


def test_nesting_up_to_the_limit_and_paired_surrogates_are_fine():
    depth = MAX_JSON_DEPTH - 1
    body = parse_json_body(b'{"a": ' + b"[" * depth + b"]" * depth + b', "b": "\\ud83d\\ude00"}')
    assert body["b"] == "\U0001f600"
