"""A long prompt holds nobody: its prefill is cut into steps of about `--prefill-chunk-seconds`
shared with other prompts, so a short request's answer does not wait for the whole prefill,
and a client that hangs up stops costing the engine at the next step. (With the prefill in one
step, as before, the short chat below waited about six minutes on a 2-core CPU.)"""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
from raw_http import address, exchange, parse_reply, post_bytes

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
LONG = " ".join(f"item{i}" for i in range(700))  # about 2,100 tokens


def metrics(server) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    return {k: float(v) for k, v in (ln.rsplit(" ", 1) for ln in lines if ln[:1] != "#")}


def short_chat(server, timeout: float) -> tuple[float, dict]:
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    tic = time.monotonic()
    reply = parse_reply(exchange(server.url, post_bytes(CHAT, json.dumps(body).encode()), timeout))
    assert reply.status == 200, reply.body
    return time.monotonic() - tic, reply.json()


def test_a_long_prompt_holds_neither_short_requests_nor_its_hang_up(server):
    before = metrics(server).get('mlx_paged_requests_finished_total{reason="abort"}', 0)
    body = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4, "stream": True}
    long_client = socket.create_connection(address(server.url))
    long_client.sendall(post_bytes(CHAT, json.dumps(body).encode()))
    time.sleep(1.5)  # its prefill is under way
    waited, reply = short_chat(server, timeout=60)
    assert reply["usage"]["completion_tokens"] == 2 and waited < 30
    assert metrics(server)["mlx_paged_requests_running"] == 1, "the long prompt ended first"
    long_client.close()  # hangs up mid-prefill
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        m = metrics(server)
        if m["mlx_paged_requests_running"] == 0:
            break
        time.sleep(0.2)
    assert m["mlx_paged_requests_running"] == 0, "the abandoned prefill kept running"
    assert m['mlx_paged_requests_finished_total{reason="abort"}'] == before + 1
    assert short_chat(server, timeout=60)[0] < 15
