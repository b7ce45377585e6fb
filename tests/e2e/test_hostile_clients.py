"""Clients that misbehave, on purpose or not, get a shaped reply and cannot hurt the others:
poison parameters while another client streams, bodies without an honest length, slow and idle
connections past the cap, half-closed sockets, and requests the stdlib itself refuses."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from raw_http import address, assert_shaped_error, exchange, parse_reply, post_bytes, read_all
from server_process import start_server

pytestmark = pytest.mark.e2e

MAX_CONNECTIONS = 4
REQUEST_TIMEOUT = 3
HI = [{"role": "user", "content": "Hi"}]
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def srv(tmp_path_factory, smollm2_dir):
    server = start_server(
        tmp_path_factory.mktemp("hostile"),
        "--max-tokens",
        "8",
        "--request-timeout",
        str(REQUEST_TIMEOUT),
        "--max-connections",
        str(MAX_CONNECTIONS),
        "--kv-budget",
        "64MB",
    )
    yield server
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()  # clients that went away are not errors


def chat(srv, body: dict, timeout: float = 60):
    return parse_reply(exchange(srv.url, post_bytes(CHAT, json.dumps(body).encode()), timeout))


def stream_chat(srv, body: dict) -> list[str]:
    """The data lines of a streamed chat completion."""
    req = urllib.request.Request(
        srv.url + CHAT,
        json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return [line.decode().strip() for line in resp if line.startswith(b"data: ")]


def healthy(srv) -> bool:
    with urllib.request.urlopen(srv.url + "/health", timeout=10) as r:
        return json.load(r)["status"] == "ok"


POISON = [
    ({"temperature": 1, "top_k": 100000}, "top_k"),
    ({"repetition_penalty": 10**19}, "repetition_penalty"),
    ({"repetition_context_size": 10**19, "repetition_penalty": 1.1}, "repetition_context_size"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"n": True}, "n"),
    ({"logit_bias": {"5": 10**19}}, "logit_bias"),
]


def test_poison_parameters_are_refused_while_another_client_streams(srv):
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        other = pool.submit(
            stream_chat,
            srv,
            {"messages": HI, "max_tokens": 60, "temperature": 0.7, "logit_bias": {"2": -100}},
        )
        for extra, param in POISON:
            err = assert_shaped_error(chat(srv, {"messages": HI, "max_tokens": 2, **extra}), 400)
            assert err["param"] == param
        lines = other.result()
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)
    sampled = chat(srv, {"messages": HI, "max_tokens": 2, "temperature": 1, "top_k": 40})
    assert sampled.status == 200 and healthy(srv)


@pytest.mark.parametrize(
    "headers,body,status,fragment",
    [
        ("Content-Length: -1\r\n", b"{}", 400, "non-negative"),
        ("Content-Length: 2\r\nContent-Length: 2\r\n", b"{}", 400, "more than one"),
        ("Content-Length: +2\r\n", b"{}", 400, "non-negative"),
        ("Transfer-Encoding: chunked\r\n", b"2\r\n{}\r\n0\r\n\r\n", 411, "Content-Length"),
        ("Content-Length: 50\r\n", b"{}", 400, "ended after 2 of the 50 bytes"),
    ],
)
def test_dishonest_lengths_are_refused(srv, headers, body, status, fragment):
    request = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() + body
    reply = parse_reply(exchange(srv.url, request, timeout=30, half_close=True))
    assert_shaped_error(reply, status, fragment)


@pytest.mark.parametrize(
    "request_bytes,status,fragment",
    [
        (f"GET {CHAT} HTTP/1.1\r\n\r\n".encode(), 405, "use POST"),
        (b"POST /health HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405, "use GET"),
        (f"PUT {CHAT} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode(), 405, "PUT"),
        (b"DELETE /v1/models HTTP/1.1\r\n\r\n", 405, "DELETE"),
        (b"BREW /health HTTP/1.1\r\n\r\n", 501, "BREW"),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414, ""),
        (b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 120 + b"\r\n", 431, ""),
        (b"GET /health HTTP/2.0\r\n\r\n", 505, ""),
        (b"GET /health HTTQ/1.1\r\n\r\n", 400, "version"),
        (b"GET /nowhere HTTP/1.1\r\n\r\n", 404, "no route"),
    ],
)
def test_the_stdlib_refusals_are_openai_shaped(srv, request_bytes, status, fragment):
    reply = parse_reply(exchange(srv.url, request_bytes, timeout=30, half_close=True))
    err = assert_shaped_error(reply, status, fragment)
    if status == 405:
        assert reply.headers["allow"] in ("POST, OPTIONS", "GET, HEAD, OPTIONS")
    assert err["type"]


def test_head_answers_headers_only(srv):
    data = exchange(srv.url, b"HEAD /health HTTP/1.1\r\nConnection: close\r\n\r\n", timeout=30)
    head, _, rest = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and rest == b""


@pytest.mark.parametrize(
    "raw,fragment",
    [
        (b"[" * 5000 + b"]" * 5000, "deeper than"),
        (b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}", "deeper than"),
        (b'{"prompt": "\\ud800 hi", "max_tokens": 2}', "surrogate"),
        (json.dumps({"messages": HI, "model": []}).encode(), "model must be a string"),
        (json.dumps({"messages": HI, "model": {}}).encode(), "model must be a string"),
        (
            json.dumps(
                {"messages": [{"role": "assistant", "content": "x", "tool_calls": 5}]}
            ).encode(),
            "tool_calls must be a list",
        ),
    ],
)
def test_bodies_that_used_to_drop_the_connection_get_400(srv, raw, fragment):
    path = "/v1/completions" if b"prompt" in raw else CHAT
    assert_shaped_error(parse_reply(exchange(srv.url, post_bytes(path, raw))), 400, fragment)


def test_slow_requests_get_408_and_a_silent_connection_is_closed(srv):
    start = time.monotonic()
    with socket.create_connection(address(srv.url)) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nContent-Length: 100\r\n\r\n{{".encode())
        reply = parse_reply(read_all(sock, 30))
    assert_shaped_error(reply, 408, "--request-timeout")
    with socket.create_connection(address(srv.url)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Slow: ")  # headers never finished
        assert_shaped_error(parse_reply(read_all(sock, 30)), 408)
    with socket.create_connection(address(srv.url)) as sock:
        assert read_all(sock, 30) == b""  # nothing sent: closed without a word
    assert time.monotonic() - start < 3 * REQUEST_TIMEOUT + 4


def test_idle_connections_past_the_cap_do_not_lock_clients_out(srv):
    opened = time.monotonic()
    idle = [socket.create_connection(address(srv.url)) for _ in range(3 * MAX_CONNECTIONS)]
    try:
        # The oldest idle connections make room for newer ones at once, not at their deadline.
        assert read_all(idle[0], timeout=REQUEST_TIMEOUT) == b""
        assert time.monotonic() - opened < REQUEST_TIMEOUT
        reply = chat(srv, {"messages": HI, "max_tokens": 2})
        assert reply.status == 200
    finally:
        for sock in idle:
            sock.close()


def test_a_slow_body_evicted_at_the_cap_gets_408(srv):
    with socket.create_connection(address(srv.url)) as slow:
        slow.sendall(f"POST {CHAT} HTTP/1.1\r\nContent-Length: 100\r\n\r\n{{".encode())
        time.sleep(0.3)  # its body is being read when the newcomers arrive
        newcomers = [socket.create_connection(address(srv.url)) for _ in range(MAX_CONNECTIONS)]
        try:
            reply = parse_reply(read_all(slow, REQUEST_TIMEOUT))
        finally:
            for sock in newcomers:
                sock.close()
    err = assert_shaped_error(reply, 408, "--max-connections")
    assert "1 of the 100 body bytes came" in err["message"]


def test_when_every_connection_is_busy_a_new_one_gets_503(srv):
    # Streams short enough to end by themselves before the deadline below, should a hang-up
    # go unnoticed (that has its own test).
    body = {"messages": HI, "max_tokens": 24, "logit_bias": {"2": -100}, "stream": True}
    busy = [socket.create_connection(address(srv.url)) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in busy:
            sock.sendall(post_bytes(CHAT, json.dumps(body).encode()))
            assert sock.recv(12) == b"HTTP/1.1 200"  # its stream started: the connection is busy
        reply = parse_reply(exchange(srv.url, b"GET /health HTTP/1.1\r\n\r\n", timeout=10))
        err = assert_shaped_error(reply, 503, "--max-connections")
        assert err["code"] == "server_busy"
    finally:
        for sock in busy:
            sock.close()
    # The server recovers: a slot frees once a hung-up stream's handler ends. (A second check
    # right after a 200 could race the first check's own handler, still busy answering it.)
    # The hung-up streams must be gone too, or their slots may still fill the cap for the tests
    # after this one.
    deadline = time.monotonic() + 60
    status, body = _health_status(srv)
    while status != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
        status, body = _health_status(srv)
    assert status == 200, f"/health: {status} {body!r}\n{srv.log()[-3000:]}"
    while _metric(srv, "mlx_paged_requests_running") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _health_status(srv)[0] == 200


def _metric(srv, name: str) -> float:
    """The value of the /metrics line that starts with `name` (0 where there is none)."""
    with urllib.request.urlopen(srv.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def _health_status(srv) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(srv.url + "/health", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError as exc:
        return 0, repr(exc).encode()


@pytest.mark.parametrize("stream", [False, True])
def test_a_half_closed_client_still_gets_its_answer(srv, stream):
    body = {"messages": HI, "max_tokens": 8, "logit_bias": {"2": -100}, "stream": stream}
    data = exchange(srv.url, post_bytes(CHAT, json.dumps(body).encode()), half_close=True)
    reply = parse_reply(data)
    assert reply.status == 200
    if stream:
        assert reply.body.rstrip().endswith(b"data: [DONE]") and b'"error"' not in reply.body
    else:
        assert reply.json()["usage"]["completion_tokens"] == 8


def test_a_client_that_hangs_up_on_a_plain_request_cancels_it(srv):
    def aborted() -> float:
        return _metric(srv, 'mlx_paged_requests_finished_total{reason="abort"}')

    before = aborted()
    body = {"messages": HI, "max_tokens": 1000, "logit_bias": {"2": -100}}
    with socket.create_connection(address(srv.url)) as sock:
        sock.sendall(post_bytes(CHAT, json.dumps(body).encode()))
        time.sleep(1.0)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and aborted() < before + 1:
        time.sleep(0.2)
    assert aborted() == before + 1
