"""Many sockets against one server: past descriptor 1023 (a server started with the usual soft
limit of 1024 open files raises it toward `--max-connections`, and its liveness checks, which
`select.select` would refuse there, still tell a waiting client from one that left), and
hundreds of connections holding unfinished headers (bounded in sum, not only per line)."""

from __future__ import annotations

import json
import re
import resource
import socket
import sys
import time

import pytest
from raw_http import address, exchange, parse_reply, post_bytes
from server_process import start_server

pytestmark = pytest.mark.e2e

IDLE = 1100
HI = [{"role": "user", "content": "Hi"}]


def _soft_limit_1024() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))


@pytest.fixture(scope="module")
def srv(tmp_path_factory, smollm2_dir):
    """A server allowing 2000 connections, started under a soft limit of 1024 open files; this
    test process may then hold the idle connections and a few more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < IDLE + 256:
        pytest.skip(f"the hard open-file limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, IDLE + 256), hard))
    server = start_server(
        tmp_path_factory.mktemp("many"),
        "--max-connections", "2000", "--max-tokens", "6", "--kv-budget", "64MB",
        "--max-request-bytes", "1MB", "--max-pending-bytes", "1MB",
        preexec_fn=_soft_limit_1024,
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log()
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_liveness_past_descriptor_1023(srv):
    # (MLX raises the soft limit to 2048 itself on import, short of the 2000 + spares.)
    assert re.search(r"raised the open-file limit from \d+ to 2128", srv.log())
    idle = [socket.create_connection(address(srv.url)) for _ in range(IDLE)]
    try:
        body = {"messages": HI, "max_tokens": 6, "logit_bias": {"2": -100}}
        request = post_bytes("/v1/chat/completions", json.dumps(body).encode())
        reply = parse_reply(exchange(srv.url, request, 120))
        assert reply.status == 200, reply.body
        assert reply.json()["usage"]["completion_tokens"] == 6
        request = post_bytes("/v1/chat/completions", json.dumps({**body, "stream": True}).encode())
        raw = exchange(srv.url, request, 120)
    finally:
        for sock in idle:
            sock.close()
    chunks = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text and b'"error"' not in raw and raw.rstrip().endswith(b"data: [DONE]")


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_unfinished_headers_cannot_pin_the_servers_memory(srv):
    line = b"X-Bloat: " + b"a" * 64_000 + b"\r\n"
    before = _rss_bytes(srv.proc.pid)
    held = []
    try:
        for _ in range(100):  # each tries 99 lines (6.3 MB) and never ends its headers
            sock = socket.create_connection(address(srv.url))
            held.append(sock)
            sock.sendall(b"GET /health HTTP/1.1\r\n")
            try:
                for _ in range(99):
                    sock.sendall(line)
            except OSError:  # refused past the budget, and closed
                pass
        time.sleep(2)  # what the kernel still buffers reaches the server
        grown = _rss_bytes(srv.proc.pid) - before
        raw = _read_reply(held[0])
    finally:
        for sock in held:
            sock.close()
    assert grown < 64 * 2**20, f"the front process grew by {grown / 2**20:.0f} MiB"
    reply = parse_reply(raw)
    assert reply.status == 431 and "in all" in reply.json()["error"]["message"]


def _read_reply(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 200:
        try:
            chunk = sock.recv(65536)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def test_bodies_in_flight_are_bounded_together(srv):
    body = {"messages": HI, "max_tokens": 1, "pad": "x" * 600_000}
    request = post_bytes("/v1/chat/completions", json.dumps(body).encode())
    with socket.create_connection(address(srv.url)) as slow:
        slow.sendall(request[: request.index(b"\r\n\r\n") + 1000])  # 600 kB announced
        time.sleep(0.5)
        reply = parse_reply(exchange(srv.url, request, 60))
        assert reply.status == 503, reply.body
        assert reply.json()["error"]["code"] == "server_busy"
        assert "--max-pending-bytes" in reply.json()["error"]["message"]
    time.sleep(0.5)  # the slow body's reservation ends with its connection
    assert parse_reply(exchange(srv.url, request, 60)).status == 200
