"""API keys, binding and clean shutdown, each on its own server process."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time

import pytest
from server_process import start_server

pytestmark = pytest.mark.e2e

MODEL = "SmolLM2-135M-Instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
SECRET = "s3cret-key-do-not-log"


def request(url, method, path, body=None, headers=None):
    host, port = url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    conn.request(method, path, json.dumps(body) if body is not None else None,
                 {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def test_api_key_is_enforced_and_never_logged(tmp_path):
    from openai import AuthenticationError, OpenAI

    srv = start_server(tmp_path, "--api-key", SECRET, "--max-tokens", "12")
    try:
        body = {"model": MODEL, "messages": FRANCE}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": SECRET}):
            status, data = request(srv.url, "POST", "/v1/chat/completions", body, headers)
            assert status == 401 and json.loads(data)["error"]["code"] == "invalid_api_key"
        assert request(srv.url, "GET", "/v1/models")[0] == 401
        assert request(srv.url, "GET", "/metrics")[0] == 401
        assert request(srv.url, "GET", "/health")[0] == 200
        with pytest.raises(AuthenticationError):
            OpenAI(base_url=srv.url + "/v1", api_key="nope", max_retries=0).models.list()
        client = OpenAI(base_url=srv.url + "/v1", api_key=SECRET, max_retries=0)
        r = client.chat.completions.create(model=MODEL, messages=FRANCE)
        assert r.choices[0].message.content == "The capital of France is Paris."
    finally:
        assert srv.stop() == 0
    assert SECRET not in srv.log()
    assert "127.0.0.1" in srv.log()  # bound to loopback by default


def test_sigterm_finishes_in_flight_requests_and_exits_zero(tmp_path):
    srv = start_server(tmp_path)
    result = {}

    def slow_request():
        body = {"model": MODEL, "messages": FRANCE, "max_tokens": 30, "logit_bias": {"2": -100}}
        result["status"], data = request(srv.url, "POST", "/v1/chat/completions", body)
        result["body"] = json.loads(data)

    t = threading.Thread(target=slow_request)
    t.start()
    time.sleep(1.5)  # the request is in flight
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) == 0, srv.log()
    t.join(10)
    assert result["status"] == 200
    assert result["body"]["usage"]["completion_tokens"] == 30
    assert result["body"]["choices"][0]["message"]["content"].startswith("The capital of France")


def test_sigint_with_a_stuck_stream_cancels_it_after_the_grace_period(tmp_path):
    srv = start_server(tmp_path, "--shutdown-grace", "1")
    host, port = srv.url[len("http://"):].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = {"model": MODEL, "messages": FRANCE, "max_tokens": 2000, "stream": True,
            "logit_bias": {"2": -100}}
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data_lines = 0
    while data_lines < 3:  # the stream is under way
        data_lines += resp.fp.readline().startswith(b"data: ")
    srv.proc.send_signal(signal.SIGINT)
    rest = resp.read().decode()
    assert srv.proc.wait(60) == 0, srv.log()
    assert '"error"' in rest and rest.rstrip().endswith("data: [DONE]")
    # New connections are refused once shutdown started.
    with pytest.raises(OSError):
        request(srv.url, "GET", "/health")
